"""The three real families on tiny random checkpoints of their real transformers classes.

Each family's folder is built once (tests/tiny_checkpoints.py) in the exact on-disk layout users
download, loaded through `load_model`, and checked for:
  * seed-exactness: with verify="gumbel", AR, SJD and SJD-PAC (CFG and top-k on) give identical
    tokens - this catches cache, mask, position-id and layout bugs in the adapters;
  * the right target: the AR tokens equal a naive reference loop that runs full forwards of the
    plain transformers model (no cache, no padding, no adapter) through the same recipe;
  * the token layout (forced tokens in place, only image codes inside rows) and the real ids;
  * decoding (size, mode, value spread) and our Chameleon VQGAN against a functional re-derivation
    of taming's decoder from the raw checkpoint;
  * bad input: one-sentence errors, raised before any weights are read.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sjd_pac_core as sp
from sjd_pac_core.models import emu3 as emu3_mod
from sjd_pac_core.models import janus as janus_mod
from sjd_pac_core.models import loader
from sjd_pac_core.models import lumina_mgpt
from sjd_pac_core.sampling.recipe import SamplingRecipe, processed_logits
from sjd_pac_core.sampling.verify import gumbel_argmax_of_logs, gumbel_noise
from tiny_checkpoints import BUILDERS, TINY_VQGAN

torch.set_num_threads(1)

FAMILIES = ["lumina_mgpt", "emu3", "janus"]
# Tiny grids: 6x6 codes (Lumina 96x96 at 16 px/code, Emu3 48x48 at 8 px/code, Janus 96x96).
TEST_RESOLUTION = {"lumina_mgpt": "96x96", "emu3": "48x48", "janus": "96x96"}
PROMPT = "a red cat on the blue field"


# The tiny Lumina-mGPT checkpoint runs at 96x96 / 64x64 (conftest.py).
pytestmark = pytest.mark.usefixtures("tiny_lumina_sizes")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_checkpoints")
    return {family: BUILDERS[family](root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def models(folders):
    return {family: sp.load_model(folders[family], dtype="fp32", device="cpu") for family in FAMILIES}


def config_for(model, method: str, **kw) -> sp.SamplerConfig:
    return model.defaults.sampler_config(method=method, verify="gumbel", cfg_scale=3.0, top_k=20, **kw)


def run(model, method: str, seed: int, **kw) -> sp.SampleResult:
    enc = model.encode_prompt(PROMPT)
    return sp.sample_tokens(
        model, enc.prompt_ids, enc.layout.num_tokens, config=config_for(model, method, **kw), seed=seed,
        uncond_prompt_ids=enc.uncond_ids, allowed_tokens=enc.constraints,
    )


# --- loading and layout ------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_loads_family_with_its_settings(models, family):
    model = models[family]
    assert model.family == family
    assert model.defaults.resolution == TEST_RESOLUTION[family]
    assert model.device.type == "cpu"
    enc = model.encode_prompt(PROMPT)
    assert enc.resolution == TEST_RESOLUTION[family]
    assert enc.layout.rows == enc.layout.cols == 6
    assert enc.constraints.vocab_size == model.token_model.vocab_size
    expected = {"lumina_mgpt": (3.0, 2000), "emu3": (3.0, 2048), "janus": (5.0, None)}[family]
    assert (model.defaults.cfg_scale, model.defaults.top_k) == expected


def test_lumina_sequence_uses_chameleon_ids(models):
    model = models["lumina_mgpt"]
    enc = model.encode_prompt(PROMPT, resolution="96x96")
    ids = enc.prompt_ids.tolist()
    # <s> ... <reserved08706> <racm3:break> size size, with size token 8804 + 96/32.
    assert ids[0] == 0 and ids[-4:] == [8710, 8197, 8807, 8807]
    assert enc.uncond_ids.tolist() == [8197, 8807, 8807]
    text = model.text_tokenizer.decode(ids[1:-4], skip_special_tokens=False)
    assert "Generate an image of 96 x 96" in text.replace("9 6", "96")
    space = model.token_model.token_space
    assert space[-2:].tolist() == [8803, 8196]  # end-of-line, <eoss>
    assert sorted(space[:-2].tolist()) == list(range(4, 8196))
    # Tokens per image at the real sizes (models.md counts the 3 image-start tokens too).
    real = {512: 1060, 768: 2356, 1024: 4164}
    for size, count in real.items():
        assert model.layout(f"{size}x{size}").num_tokens + 3 == count


def test_lumina_default_size_follows_folder_name():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lumina_mgpt, "LUMINA_SIZES", (768, 512, 1024))
        assert lumina_mgpt.default_sizes(Path("lumina-mgpt-7b-512")) == (512, 768, 1024)
        assert lumina_mgpt.default_sizes(Path("lumina-mgpt-7b-768"))[0] == 768
        assert lumina_mgpt.default_sizes(Path("Lumina-mGPT-7B-1024"))[0] == 1024
        assert lumina_mgpt.default_sizes(Path("my-lumina"))[0] == 768


def test_emu3_prompts_and_resolutions(models):
    model = models["emu3"]
    tok = model.processor.tokenizer
    enc = model.encode_prompt(PROMPT, negative_prompt="blurry")
    tail = tok.convert_ids_to_tokens(enc.prompt_ids[-5:].tolist())
    assert tail == ["<|image start|>", "6", "*", "6", "<|image token|>"]
    assert enc.prompt_ids[0] == tok.bos_token_id
    assert enc.uncond_ids[-5:].tolist() == enc.prompt_ids[-5:].tolist()
    assert enc.layout.num_tokens == 6 * 7 + 3
    # Aspect ratios at the checkpoint's image area; 720x720 (90x90 codes, 8193 tokens) by default.
    assert set(model.defaults.resolutions) >= {"48x48", "56x40", "40x56"}
    rows, cols = model.processor.calculate_generate_size("1:1", emu3_mod.DEFAULT_IMAGE_AREA, 8)
    assert (rows, cols) == (90, 90)
    assert sp.ImageLayout(rows, cols, row_end=0, tail=(1, 2, 3)).num_tokens == 8193


def test_janus_unconditional_row_pads_all_but_bos_and_boi(models):
    model = models["janus"]
    enc = model.encode_prompt(PROMPT)
    ids, uncond = enc.prompt_ids, enc.uncond_ids
    assert ids[0] == model.bos_id and ids[-1] == model.boi_id
    assert uncond.shape == ids.shape
    assert uncond[0] == model.bos_id and uncond[-1] == model.boi_id
    assert (uncond[1:-1] == model.pad_id).all()
    assert enc.layout.num_tokens == 36 and enc.layout.row_end is None


# --- sampling -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_ar_sjd_and_sjd_pac_give_identical_tokens(models, family):
    model = models[family]
    enc = model.encode_prompt(PROMPT)
    forced = enc.layout.forced_tokens()
    passes = {"ar": 0, "sjd": 0, "sjd_pac": 0}
    tree_passes = 0
    for seed in (0, 1, 2):
        ar = run(model, "ar", seed)
        runs = {
            "sjd": run(model, "sjd", seed, window=8),
            "sjd_pac": run(model, "sjd_pac", seed, window=16, tree_width=3),
            "sjd_pac_narrow": run(model, "sjd_pac", seed, window=8, tree_width=2, tree_depth=2),
        }
        for name, result in runs.items():
            assert torch.equal(result.tokens, ar.tokens), f"{family} {name} seed {seed}"
        # Layout: forced tokens in place, only image codes inside the rows.
        free = forced < 0
        assert torch.equal(ar.tokens[~free], forced[~free])
        assert bool((ar.tokens[free] < model.num_codes).all())
        passes["ar"] += len(ar.stats.records)
        passes["sjd"] += len(runs["sjd"].stats.records)
        passes["sjd_pac"] += len(runs["sjd_pac"].stats.records)
        tree_passes += sum(r.tree_nodes > 0 for r in runs["sjd_pac"].stats.records)
    # The speculative paths really ran: fewer passes than AR, and Proactive Drafting trees.
    assert passes["sjd"] < passes["ar"] and passes["sjd_pac"] < passes["ar"]
    assert tree_passes > 0


def _reference_logits(model, family: str, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token logits over the sampler's token space from one plain full forward."""
    hf = model.model
    with torch.no_grad():
        if family == "janus":
            embeds = torch.cat([hf.get_input_embeddings()(prompt), hf.prepare_embeddings_for_image_generation(tokens)])
            hidden = hf.model.language_model(inputs_embeds=embeds[None]).last_hidden_state[0, -1]
            return hf.model.generation_head(hidden)
        space = model.token_model.token_space
        ids = torch.cat([prompt, space[tokens]])
        hidden = hf.model(input_ids=ids[None]).last_hidden_state[0, -1]
        return hf.lm_head(hidden)[space]


@pytest.mark.parametrize("family", FAMILIES)
def test_ar_matches_a_naive_full_forward_loop(models, family):
    """The adapter samples from the model's real distribution: same tokens as a loop of full
    forwards of the unmodified model (conditional and unconditional prompt each on its own)."""
    model = models[family]
    enc = model.encode_prompt(PROMPT)
    seed, cfg = 5, config_for(model, "ar")
    recipe = SamplingRecipe(cfg.cfg_scale, cfg.temperature, cfg.top_k, cfg.top_p)
    constraints = enc.constraints
    vocab = model.token_model.vocab_size
    tokens = torch.zeros(0, dtype=torch.long)
    for t in range(enc.layout.num_tokens):
        logits = torch.stack([
            _reference_logits(model, family, enc.prompt_ids, tokens),
            _reference_logits(model, family, enc.uncond_ids, tokens),
        ])[:, None]
        pos = torch.tensor([t])
        processed = processed_logits(logits, pos, recipe, constraints)  # log p up to a constant
        tokens = torch.cat([tokens, gumbel_argmax_of_logs(processed, gumbel_noise(seed, pos, vocab))])
    assert torch.equal(run(model, "ar", seed).tokens, tokens)


def test_kv_cache_is_freed_after_generation(models):
    model = models["janus"]
    sessions = []
    original = model.token_model.open_session

    def spy(prompts):
        sessions.append(original(prompts))
        return sessions[-1]

    model.token_model.open_session = spy
    try:
        sp.generate_image(model, PROMPT, config=config_for(model, "sjd_pac", window=8), seed=0)
    finally:
        del model.token_model.open_session
    assert sessions and sessions[0].cache is None


# --- decoding -----------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_gives_images_of_the_resolution(models, family):
    model = models[family]
    tokens = torch.stack([run(model, "sjd_pac", seed, window=16).tokens for seed in (0, 1)])
    images = model.decode(tokens, TEST_RESOLUTION[family])
    width, height = (int(v) for v in TEST_RESOLUTION[family].split("x"))
    assert len(images) == 2
    for image in images:
        assert image.size == (width, height) and image.mode == "RGB"
        arr = torch.from_numpy(np.asarray(image).astype(np.float32))
        assert 0 <= arr.min() and arr.max() <= 255 and arr.std() > 1.0
    # One image as a flat token row, resolution inferred from the length.
    assert model.decode(tokens[0])[0].size == (width, height)


def _taming_decode(sd: Dict[str, torch.Tensor], codes: torch.Tensor, params: dict) -> torch.Tensor:
    """taming-transformers' Decoder, re-derived functionally from the raw checkpoint keys."""
    dd = params["ddconfig"]

    def gn(x, name):
        return F.group_norm(x, 32, sd[f"{name}.weight"], sd[f"{name}.bias"], eps=1e-6)

    def conv(x, name):
        w = sd[f"{name}.weight"]
        return F.conv2d(x, w, sd[f"{name}.bias"], padding=w.shape[-1] // 2)

    def res(x, name):
        h = conv(F.silu(gn(x, f"{name}.norm1")), f"{name}.conv1")
        h = conv(F.silu(gn(h, f"{name}.norm2")), f"{name}.conv2")
        return (conv(x, f"{name}.nin_shortcut") if f"{name}.nin_shortcut.weight" in sd else x) + h

    def attn(x, name):
        b, c, hh, ww = x.shape
        h = gn(x, f"{name}.norm")
        q, k, v = (conv(h, f"{name}.{p}").reshape(b, c, hh * ww) for p in "qkv")
        w = torch.softmax(torch.bmm(q.permute(0, 2, 1), k) * c ** -0.5, dim=2)
        out = torch.bmm(v, w.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + conv(out, f"{name}.proj_out")

    z = sd["quantize.embedding.weight"][codes].permute(0, 3, 1, 2)
    h = conv(conv(z, "post_quant_conv"), "decoder.conv_in")
    h = res(attn(res(h, "decoder.mid.block_1"), "decoder.mid.attn_1"), "decoder.mid.block_2")
    for level in reversed(range(len(dd["ch_mult"]))):
        for i in range(dd["num_res_blocks"] + 1):
            h = res(h, f"decoder.up.{level}.block.{i}")
            if f"decoder.up.{level}.attn.{i}.q.weight" in sd:
                h = attn(h, f"decoder.up.{level}.attn.{i}")
        if level != 0:
            h = conv(F.interpolate(h, scale_factor=2.0, mode="nearest"), f"decoder.up.{level}.upsample.conv")
    return conv(F.silu(gn(h, "decoder.norm_out")), "decoder.conv_out")


def test_chameleon_vqgan_matches_taming_decoder(models, folders):
    vqgan = models["lumina_mgpt"].vqgan
    sd = torch.load(folders["lumina_mgpt"] / "vqgan.ckpt", weights_only=True)["state_dict"]
    assert any(k.startswith("decoder.up.4.attn.") for k in sd)  # attention inside an up level
    assert any(k.endswith("nin_shortcut.weight") for k in sd)  # a width change
    codes = torch.randint(0, 8192, (2, 5, 6), generator=torch.Generator().manual_seed(0))
    ours = vqgan.decode_codes(codes)
    ref = _taming_decode(sd, codes, TINY_VQGAN)
    assert ours.shape == (2, 3, 80, 96) and vqgan.downsample == 16
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4)


# --- memory and devices -------------------------------------------------------------------------
def test_bf16_load_and_sample(folders):
    model = sp.load_model(folders["janus"], dtype="bf16", device="cpu")
    assert model.model.dtype == torch.bfloat16
    result = sp.generate_image(model, PROMPT, config=config_for(model, "sjd_pac", window=8), seed=0)
    assert result.images[0].size == (96, 96)


def test_auto_device_spreads_only_when_the_plan_does_not_fit(folders, monkeypatch):
    """device="auto" on a GPU spills onto the CPU (accelerate's "auto" map) only when the memory
    plan says the unquantized model does not fit; an explicit device is a promise to fit."""
    from sjd_pac_core.models import memory

    folder = folders["janus"]
    seen = {}

    def fake_load(cls, folder, config, dtype, device, options=None):
        seen["device_map"] = options.device_map
        raise sp.ModelLoadError("stop here.")

    monkeypatch.setattr(janus_mod.JanusImageModel, "load", classmethod(fake_load))
    real_find_spec = importlib.util.find_spec  # the decision only: accelerate counts as installed
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "accelerate" else real_find_spec(name, *a))
    monkeypatch.setattr(loader, "resolve_device", lambda device="auto": torch.device("cuda"))
    monkeypatch.setattr(loader, "resolve_dtype", lambda dtype, device: torch.float32)
    plan = sp.memory_plan(folder, dtype="fp32", device="cpu")
    need = plan.cost("none").total
    for free, expected in ((need * 10, None), (need // 2, "auto")):
        monkeypatch.setattr(memory, "free_memory", lambda device, free=free: free)
        with pytest.raises(sp.ModelLoadError, match="stop here"):
            sp.load_model(folder, device="auto")
        assert seen.pop("device_map") == expected
    with pytest.raises(sp.ModelLoadError, match="needs .* GB in fp32, .* GB free on cuda"):
        sp.load_model(folder, device="cuda")  # explicit: the plan's sentence, nothing loaded


# --- bad input ----------------------------------------------------------------------------------
# (the no_weights fixture is in conftest.py)
def _copy(src: Path, dst: Path, skip=()) -> Path:
    dst.mkdir(parents=True)
    for path in src.iterdir():
        if path.name not in skip:
            shutil.copy(path, dst / path.name)
    return dst


def _one_sentence(message: str) -> None:
    assert "\n" not in message and message.endswith(".")


def test_missing_folder(tmp_path, no_weights):
    with pytest.raises(sp.ModelLoadError, match="does not exist") as err:
        sp.load_model(tmp_path / "nope")
    _one_sentence(str(err.value))


def test_folder_without_config(tmp_path, no_weights):
    with pytest.raises(sp.ModelLoadError, match="no config.json") as err:
        sp.load_model(tmp_path)
    _one_sentence(str(err.value))


def test_unsupported_model_type(tmp_path, no_weights):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(sp.ModelLoadError, match="'bert'.*supported are") as err:
        sp.load_model(tmp_path)
    _one_sentence(str(err.value))


def test_lumina_without_vqgan_files(folders, tmp_path, no_weights):
    folder = _copy(folders["lumina_mgpt"], tmp_path / "lumina", skip=("vqgan.yaml", "vqgan.ckpt"))
    with pytest.raises(sp.ModelLoadError, match="vqgan.yaml.*vqgan.ckpt.*ckpts/chameleon/tokenizer") as err:
        sp.load_model(folder, device="cpu")
    _one_sentence(str(err.value))


def test_lumina_vqgan_in_a_subfolder_is_found(folders, tmp_path):
    folder = _copy(folders["lumina_mgpt"], tmp_path / "lumina", skip=("vqgan.yaml", "vqgan.ckpt"))
    sub = folder / "ckpts" / "chameleon" / "tokenizer"
    sub.mkdir(parents=True)
    for name in ("vqgan.yaml", "vqgan.ckpt"):
        shutil.copy(folders["lumina_mgpt"] / name, sub / name)
    assert lumina_mgpt.find_vqgan_dir(folder) == sub.resolve()


def test_truncated_safetensors(folders, tmp_path, no_weights):
    folder = _copy(folders["emu3"], tmp_path / "emu3")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(sp.ModelLoadError, match="truncated.*download it again") as err:
        sp.load_model(folder, device="cpu")
    _one_sentence(str(err.value))


def test_missing_weight_shard(folders, tmp_path, no_weights):
    folder = _copy(folders["janus"], tmp_path / "janus", skip=("model.safetensors",))
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(sp.ModelLoadError, match="lacks 1 weight shard.*deepseek-community/Janus-Pro") as err:
        sp.load_model(folder, device="cpu")
    _one_sentence(str(err.value))


def test_truncated_vqgan_checkpoint(folders, tmp_path, monkeypatch):
    # The VQGAN loads first (it is small), so a bad vqgan.ckpt fails before the LLM weights.
    folder = _copy(folders["lumina_mgpt"], tmp_path / "lumina")
    ckpt = folder / "vqgan.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    monkeypatch.setattr(lumina_mgpt, "load_pretrained", lambda *a, **k: pytest.fail("LLM weights loaded"))
    with pytest.raises(sp.ModelLoadError, match="vqgan.ckpt.*download") as err:
        sp.load_model(folder, device="cpu")
    _one_sentence(str(err.value))


@pytest.mark.parametrize("family", FAMILIES)
def test_unsupported_resolution(models, family):
    with pytest.raises(sp.ConfigError, match="does not support resolution 123x123; choose one of") as err:
        models[family].encode_prompt(PROMPT, resolution="123x123")
    _one_sentence(str(err.value))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda(folders, no_weights):
    with pytest.raises(sp.ModelLoadError, match="CUDA was asked for") as err:
        sp.load_model(folders["emu3"], device="cuda")
    _one_sentence(str(err.value))


def test_negative_prompt_warnings(models):
    assert models["lumina_mgpt"].encode_prompt(PROMPT, negative_prompt="blurry").warnings
    assert models["janus"].encode_prompt(PROMPT, negative_prompt="blurry").warnings
    assert not models["emu3"].encode_prompt(PROMPT, negative_prompt="blurry").warnings


def test_original_janus_format_names_the_hf_version(tmp_path, no_weights):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "multi_modality"}))
    with pytest.raises(sp.ModelLoadError, match="deepseek-community/Janus-Pro-7B") as err:
        sp.load_model(tmp_path)
    _one_sentence(str(err.value))


@pytest.mark.parametrize("family", FAMILIES)
def test_preview_of_a_partial_image(models, family):
    model = models[family]
    tokens = run(model, "sjd_pac", 0, window=16).tokens
    width, height = (int(v) for v in TEST_RESOLUTION[family].split("x"))
    half = model.preview(tokens[: tokens.shape[0] // 2])
    assert half.size == (width, height)
    full = np.asarray(model.preview(tokens))
    assert np.array_equal(full, np.asarray(model.decode(tokens)[0]))  # nothing dimmed when done
    assert np.asarray(half)[-1].max() <= 63  # the last row is not sampled yet: dimmed to a quarter
