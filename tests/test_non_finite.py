"""Non-finite probabilities, one row per cause: a knob that overflows float32 is refused by the one
config validation before any work; a model or setting that still makes p NaN or infinite stops
the run with one sentence naming the image token and the likely cause, found inside the pass's
one host sync (tests/test_engine.py counts it) for AR, SJD and SJD-PAC under both rules.

Before this check, a NaN p drew the same token everywhere (token 0 under gumbel, the last id
under rejection), overwrote forced tokens and returned with no word.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

import sjd_pac_core as sp
from sjd_pac_core.config import LARGEST_LOGIT_SCALE, SMALLEST_NORMAL_FLOAT32
from sjd_pac_core.engine.finite import NonFiniteError, first_non_finite, likely_cause
from sjd_pac_core.models import loader
from sjd_pac_core.sampling.recipe import SamplingRecipe, TokenConstraints
from sjd_pac_core.settings import config_from_settings

V = 32
N = 12
PROMPT = torch.tensor([1, 2, 3])
UNCOND = torch.tensor([1])
POISON = 7  # the token whose embedding row is NaN in one model below
FORCED_AT = 5  # ...forced at this image position, allowed nowhere else
DEMO_PROMPT = "a red circle on a blue background"


def one_sentence(message: str) -> None:
    assert message.count(". ") == 0 and message.endswith("."), message


# --- 1. knobs that overflow float32: refused by the one validation ---------------------------------
KNOBS = [
    ("temperature 1e-45", dict(temperature=1e-45), "temperature = 1e-45 is below 1.18e-38"),
    ("temperature half the smallest normal", dict(temperature=SMALLEST_NORMAL_FLOAT32 / 2),
     "the smallest normal float32 number, so dividing the logits by it overflows"),
    ("cfg_scale 3.5e38", dict(cfg_scale=3.5e38), "cfg_scale = 3.5e+38 is above 8.51e+37"),
    ("cfg_scale just past the bound", dict(cfg_scale=LARGEST_LOGIT_SCALE * 1.01), "guided logits overflow float32"),
    ("top_p 1e-46", dict(top_p=1e-46), "top_p = 1e-46 is below 1.18e-38"),
    ("top_p 1e-40 (subnormal)", dict(top_p=1e-40), "rounds to 0 and keeps no token"),
]


@pytest.mark.parametrize("knob,needle", [r[1:] for r in KNOBS], ids=[r[0] for r in KNOBS])
def test_knobs_that_overflow_float32_are_refused_by_the_one_validation(knob, needle):
    with pytest.raises(sp.ConfigError) as err:
        sp.SamplerConfig(**knob)
    message = str(err.value)
    assert needle in message
    one_sentence(message)
    (name, value), = knob.items()
    with pytest.raises(sp.ConfigError) as typed:  # as the CLI, the nodes and the app enter it: text
        config_from_settings(None, **{name: repr(value)})
    assert str(typed.value) == message


def test_the_bounds_themselves_are_accepted():
    """The bounds are the smallest normal float32 and its inverse, not numbers picked by hand."""
    import numpy as np

    assert SMALLEST_NORMAL_FLOAT32 == float(np.finfo(np.float32).tiny)
    assert LARGEST_LOGIT_SCALE * SMALLEST_NORMAL_FLOAT32 == pytest.approx(1.0)
    sp.SamplerConfig(temperature=SMALLEST_NORMAL_FLOAT32, cfg_scale=LARGEST_LOGIT_SCALE, top_p=SMALLEST_NORMAL_FLOAT32)


def test_the_reported_repro_is_refused_before_any_work(demo_model):
    """It returned 272 zeros (every token 0, the row ends overwritten) with no word."""
    with pytest.raises(sp.ConfigError) as err:
        sp.generate_image(demo_model, DEMO_PROMPT, config=demo_model.defaults.sampler_config(temperature=1e-45),
                          seed=0)
    assert "temperature = 1e-45" in str(err.value)
    one_sentence(str(err.value))


# --- 2. run time: the model or a setting inside the bounds still overflows -----------------------
def peaked_lm(**changes) -> LlamaForCausalLM:
    """A tiny Llama whose logits reach tens (a scaled head), so that a temperature or CFG scale
    inside the bounds overflows them."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, **changes)
    lm = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        lm.lm_head.weight.mul_(400.0)
    return lm


def poisoned_lm() -> LlamaForCausalLM:
    """NaN in one token's embedding: every position after that token gets NaN logits."""
    lm = peaked_lm()
    with torch.no_grad():
        lm.model.embed_tokens.weight[POISON] = float("nan")
    return lm


def forced_poison(force: bool = True) -> TokenConstraints:
    """The poisoned token allowed nowhere, and forced at FORCED_AT (or not at all)."""
    allowed = torch.ones(V, dtype=torch.bool)
    allowed[POISON] = False
    forced = torch.full((N,), -1, dtype=torch.long)
    if force:
        forced[FORCED_AT] = POISON
    return TokenConstraints(V, N, allowed=allowed, forced=forced)


# (name, model, config fields, uses CFG, constraints, the image token named, words of the cause)
RUNTIME = [
    ("temperature inside the bound", peaked_lm, dict(temperature=2e-38), False, None, 0, "the temperature 2e-38"),
    ("cfg_scale inside the bound", peaked_lm, dict(cfg_scale=5e37), True, None, 0, "the CFG scale 5e+37"),
    ("rms_norm_eps -1", lambda: peaked_lm(rms_norm_eps=-1.0), {}, False, None, 0, "the model itself"),
    ("NaN embedding, first met in a later pass", poisoned_lm, {}, False, forced_poison, FORCED_AT + 1,
     "the model itself"),
]
METHODS = [dict(method="ar"), dict(method="sjd", window=4), dict(method="sjd_pac", window=4, tree_width=3)]


@pytest.mark.parametrize("verify", ["rejection", "gumbel"])
@pytest.mark.parametrize("method", METHODS, ids=[m["method"] for m in METHODS])
@pytest.mark.parametrize("row", RUNTIME, ids=[r[0] for r in RUNTIME])
def test_a_non_finite_p_stops_the_run_naming_the_token_and_the_cause(row, method, verify):
    _, build, fields, cfg, constraints, position, cause = row
    config = sp.SamplerConfig(**method, **fields, verify=verify)
    passes = []
    with pytest.raises(NonFiniteError) as err:
        sp.sample_tokens(build(), PROMPT, N, config=config, seed=0, uncond_prompt_ids=UNCOND if cfg else None,
                         allowed_tokens=constraints() if constraints else None,
                         callback=lambda progress: passes.append(progress.num_tokens))
    message, named = str(err.value), err.value.position
    assert f"image token {named} of {N}:" in message, message
    if method["method"] == "ar" or position == 0:
        assert named == position, message
    else:
        # A pass that feeds the poisoned token as a draft has NaN in its keys and values, and a
        # masked-out NaN value still turns every node's attention output NaN (0 x NaN): the run
        # stops at the first node of that pass, never after the poisoned token's successor.
        assert 1 <= named <= position, message
    assert f"the likely cause is {cause}" in message, message
    one_sentence(message)
    assert bool(passes) == (position > 0)  # a NaN first token stops in the prefill, before any callback


def test_the_poisoned_model_is_healthy_before_its_token():
    """Control for the later-pass row: with the poisoned token never in the input, the same model
    samples every token (so the error above comes from the token, not from the model at large)."""
    out = sp.sample_tokens(poisoned_lm(), PROMPT, N, config=sp.SamplerConfig(method="ar"), seed=0,
                           allowed_tokens=forced_poison(force=False))
    assert out.tokens.shape == (N,) and POISON not in out.tokens.tolist()


# --- 3. checkpoints in the real on-disk format ------------------------------------------------------
@pytest.fixture
def demo_copy(tmp_path) -> Path:
    return Path(shutil.copytree(loader.DEMO_FOLDER, tmp_path / "demo"))


def test_a_finite_weight_that_overflows_stops_the_run_with_its_place_in_the_picture(demo_copy):
    path = demo_copy / "model.safetensors"
    state = load_file(path)
    state["model.layers.0.mlp.down_proj.weight"][0] = 1e38  # finite: the load-time check passes it
    save_file(state, path, metadata={"format": "pt"})
    model = sp.load_model(demo_copy, device="cpu", check_finite=True)
    with pytest.raises(NonFiniteError) as err:
        sp.generate_image(model, DEMO_PROMPT, seed=0)
    message = str(err.value)
    assert "image token 0 of 272 (row 0, column 0):" in message and "the model itself" in message, message
    assert "check_finite=True" in message and "rms_norm_eps" in message
    one_sentence(message)


@pytest.mark.parametrize("value", [-1, -1e-5, "1e-5"])
def test_a_negative_norm_epsilon_is_refused_at_load(demo_copy, value):
    config = json.loads((demo_copy / "config.json").read_text())
    config["rms_norm_eps"] = value
    (demo_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(demo_copy, device="cpu")
    message = str(err.value)
    assert f"sets rms_norm_eps to {value!r}, which is not a finite number >= 0" in message, message
    one_sentence(message)


@pytest.mark.parametrize("key,value,needle", [
    ("temperature", 1e-45, "sets temperature to 1e-45, which is below 1.18e-38"),
    ("guidance_scale", 3.5e38, "sets guidance_scale to 3.5e+38, which is above 8.51e+37"),
])
def test_a_generation_config_default_that_overflows_is_refused_at_load(demo_copy, key, value, needle):
    path = demo_copy / "generation_config.json"
    config = json.loads(path.read_text())
    config[key] = value
    path.write_text(json.dumps(config))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(demo_copy, device="cpu")
    message = str(err.value)
    assert "generation_config.json" in message and needle in message, message
    one_sentence(message)


# --- 4. the pieces, on hand-made rows ---------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
CAUSES = [
    ("NaN logit", [[1.0, NAN, 0.5]], SamplingRecipe(), "the model itself"),
    ("+inf logit", [[1.0, INF, 0.5]], SamplingRecipe(), "the model itself"),
    ("every allowed logit -inf", [[-INF, -INF, 3.0]], SamplingRecipe(), "the model itself"),
    ("CFG overflow", [[30.0, -30.0, 0.0], [0.0, 0.0, 0.0]], SamplingRecipe(cfg_scale=3e37), "the CFG scale 3e+37"),
    ("temperature overflow", [[30.0, -30.0, 0.0]], SamplingRecipe(temperature=2e-38), "the temperature 2e-38"),
    ("top-p", [[1.0, 0.0, 0.5]], SamplingRecipe(top_p=1e-46), "the top-p 1e-46"),
]


@pytest.mark.parametrize("logits,recipe,cause", [c[1:] for c in CAUSES], ids=[c[0] for c in CAUSES])
def test_likely_cause_names_the_step_that_overflowed(logits, recipe, cause):
    allowed = torch.tensor([True, True, False])  # the last token is not allowed: its logit never counts
    assert likely_cause(torch.tensor(logits), allowed, recipe).startswith(cause)


def test_a_disallowed_non_finite_logit_is_not_blamed_on_the_model():
    allowed = torch.tensor([True, True, False])
    cause = likely_cause(torch.tensor([[30.0, -30.0, NAN]]), allowed, SamplingRecipe(temperature=2e-38))
    assert cause.startswith("the temperature")


def test_first_non_finite_is_the_smallest_bad_position_or_minus_one():
    p = torch.full((4, 3), 1 / 3)
    positions = torch.tensor([5, 6, 7, 6])
    assert first_non_finite(p, positions).tolist() == [-1]
    p[2, 0] = NAN
    p[3, 1] = INF
    assert first_non_finite(p, positions).tolist() == [6]


def test_the_error_names_row_and_column_and_survives_pickling():
    err = NonFiniteError(20, 272, "the model itself").on_grid(rows=16, row_length=17)
    assert "image token 20 of 272 (row 1, column 3):" in str(err)
    assert "(row 15, column 16)" in str(NonFiniteError(271, 272, "x").on_grid(16, 17))  # a row's end token
    again = pickle.loads(pickle.dumps(err))  # a batch worker sends it to its driver
    assert isinstance(again, NonFiniteError) and str(again) == str(err) and again.position == 20


def test_healthy_runs_report_no_non_finite_position():
    """Control: the check stays silent on a model whose p is finite everywhere (every method)."""
    for method in METHODS:
        out = sp.sample_tokens(peaked_lm(), PROMPT, N, config=sp.SamplerConfig(**method), seed=0)
        assert out.tokens.shape == (N,)
