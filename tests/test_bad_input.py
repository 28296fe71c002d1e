"""Bad input gets one sentence that names the fix, before any work is done."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

import sjd_pac_core as sp


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


PROMPT = torch.tensor([1, 2, 3])


def _one_sentence(message: str) -> None:
    assert message.count(". ") == 0 and message.endswith("."), message


@pytest.mark.parametrize(
    "fields,needle",
    [
        (dict(window=0), "window (L) must be an integer >= 1"),
        (dict(tree_width=0), "tree_width (K) must be an integer >= 1"),
        (dict(tree_depth=0), "tree_depth (D) must be an integer >= 1"),
        (dict(top_k=0), "top_k must be None or an integer >= 1"),
        (dict(top_p=1.5), "top_p must be None or in (0, 1]"),
        (dict(temperature=0.0), "temperature must be > 0"),
        (dict(method="beam"), "Unknown method"),
        (dict(verify="greedy"), "Unknown verify rule"),
        (dict(cfg_scale=-1.0), "cfg_scale must be >= 0"),
    ],
)
def test_impossible_knobs_are_rejected_when_the_config_is_made(fields, needle):
    with pytest.raises(sp.ConfigError) as err:
        sp.SamplerConfig(**fields)
    assert needle in str(err.value)


def test_tree_width_larger_than_the_allowed_vocabulary(lm):
    config = sp.SamplerConfig(tree_width=5)
    with pytest.raises(sp.ConfigError, match="use a tree width of at most 4"):
        sp.sample_tokens(lm, PROMPT, 10, config=config, allowed_tokens=[3, 4, 5, 6])
    with pytest.raises(sp.ConfigError, match="at most 16"):
        # D = 2 keeps the tree (17 nodes) inside the work budget, so the vocabulary check speaks.
        sp.sample_tokens(lm, PROMPT, 10, config=sp.SamplerConfig(tree_depth=2, tree_width=17))


def test_cfg_without_an_unconditional_prompt(lm):
    with pytest.raises(sp.ConfigError) as err:
        sp.sample_tokens(lm, PROMPT, 10, config=sp.SamplerConfig(cfg_scale=3.0))
    assert "uncond_prompt_ids" in str(err.value)
    _one_sentence(str(err.value))


def test_not_a_causal_lm():
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(sp.NotACausalLMError, match="not a causal language model"):
        sp.sample_tokens(LlamaModel(config), PROMPT, 10)
    with pytest.raises(sp.NotACausalLMError):
        sp.sample_tokens("gpt2", PROMPT, 10)


@pytest.mark.parametrize("num_tokens", [0, -3])
def test_num_tokens_must_be_positive(lm, num_tokens):
    with pytest.raises(sp.ConfigError, match="num_tokens must be an integer >= 1"):
        sp.sample_tokens(lm, PROMPT, num_tokens)


def test_empty_prompt_is_rejected(lm):
    with pytest.raises(sp.ConfigError, match="prompt_ids must be a non-empty"):
        sp.sample_tokens(lm, torch.tensor([], dtype=torch.long), 5)


def test_allowed_tokens_outside_the_vocabulary(lm):
    with pytest.raises(ValueError, match="outside 0..15"):
        sp.sample_tokens(lm, PROMPT, 5, allowed_tokens=[2, 99])


def test_interrupt_frees_the_cache_and_the_model_still_works(lm):
    sessions = []
    adapter = sp.CausalLMAdapter(lm)
    original = adapter.open_session

    def tracking_open(prompts):
        session = original(prompts)
        sessions.append(session)
        return session

    adapter.open_session = tracking_open

    def stop_after_three(progress: sp.Progress) -> None:
        if progress.stats.forward_passes >= 3:
            raise sp.GenerationCancelled("stopped by the user")

    with pytest.raises(sp.GenerationCancelled):
        sp.sample_tokens(adapter, PROMPT, 50, config=sp.SamplerConfig(window=4), callback=stop_after_three)
    assert sessions[0].cache is None  # freed on the way out
    out = sp.sample_tokens(adapter, PROMPT, 20, config=sp.SamplerConfig(window=4))
    assert out.tokens.shape == (20,)


def test_corrupt_demo_weights_name_the_file_and_the_rebuild_command(tmp_path, monkeypatch):
    import shutil

    import sjd_pac_core.models.loader as loader

    copy = tmp_path / "weights"
    shutil.copytree(loader.DEMO_FOLDER, copy)
    data = (copy / "vq.safetensors").read_bytes()
    (copy / "vq.safetensors").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(loader, "DEMO_FOLDER", copy)
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model("demo")
    message = str(err.value)
    assert "vq.safetensors is truncated" in message
    assert "python -m sjd_pac_core.demo.tools.train" in message
    _one_sentence(message)
    (copy / "model.safetensors").unlink()
    (copy / "vq.safetensors").write_bytes(data)
    with pytest.raises(sp.ModelLoadError, match="python -m sjd_pac_core.demo.tools.train"):
        sp.load_model("demo")
