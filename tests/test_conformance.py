"""Conformance with the reference implementations, on tiny checkpoints in the users' on-disk layout.

* Emu3 and Janus-Pro against transformers' own image generation (`model.generate`, greedy =
  top-k 1, CFG on; Emu3 with its negative prompt through the processor, Janus with its batched
  CFG): our `ar` and `sjd_pac` (seed-exact Gumbel rule) give the same tokens, and our decoded
  pixels equal transformers' `decode_image_tokens` + the processor's `postprocess`.
* Lumina-mGPT: its reference code needs transformers 4.47, so it cannot run here; its behaviour is
  pinned by numbers produced once by running it (see LUMINA_REFERENCE below).
* Both Lumina-mGPT on-disk layouts load (its own, with [1, head_dim] q/k LayerNorm rows, and
  transformers'), every family's full size list works at a non-square size, and the sampler's
  float32 path (Apple MPS has no float64) is exact with the exactness tests' power.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from typing import Dict

import numpy as np
import pytest
import torch

import sjd_pac_core as sp
import sjd_pac_core.sampling.verify as verify
from sjd_pac_core.models import emu3 as emu3_mod
from sjd_pac_core.models import lumina_mgpt
from sjd_pac_core.models.hf_common import pixels_to_pil
from exactness_tools import assert_processed_p_matches
from tiny_checkpoints import LAYOUT_BUILDERS

torch.set_num_threads(1)

PROMPT = "a red cat on the blue field"
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module", autouse=True)
def tiny_lumina_target():
    # The tiny Lumina checkpoint is a "96" model: trained sizes from the reference rule at 96x96.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lumina_mgpt, "LUMINA_SIZES", (96, 64))
        yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("conformance_checkpoints")
    return {name: build(root / name) for name, build in LAYOUT_BUILDERS.items()}


@pytest.fixture(scope="module")
def models(folders):
    return {name: sp.load_model(folder, dtype="fp32", device="cpu") for name, folder in folders.items()}


def sample(model, method: str, resolution: str, cfg: float, top_k: int = 1, seed: int = 0, **kw) -> torch.Tensor:
    """Our tokens in the model's vocabulary ids (sampler ids mapped back)."""
    config = model.defaults.sampler_config(method=method, verify="gumbel", cfg_scale=cfg, top_k=top_k, **kw)
    result = sp.generate_image(model, PROMPT, config=config, seed=seed, resolution=resolution)
    return result


# --- Lumina-mGPT: both on-disk layouts -----------------------------------------------------------
def _safetensors_header(path: Path) -> dict:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n])


def test_lumina_fixture_has_the_converters_layout(folders):
    folder = folders["lumina_mgpt"]
    header = _safetensors_header(folder / "model.safetensors")
    assert header["model.layers.0.self_attn.q_norm.weight"]["shape"] == [1, 16]
    assert header["model.layers.1.self_attn.k_norm.bias"]["shape"] == [1, 16]
    assert not any(k.startswith("model.vqmodel.") for k in header)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["ChameleonXLLMXForConditionalGeneration"]
    assert config["model_parallel_size"] == 1 and "z_loss_weight" in config and "n_embed" in config["vq_config"]
    hf_header = _safetensors_header(folders["lumina_mgpt_transformers"] / "model.safetensors")
    assert hf_header["model.layers.0.self_attn.q_norm.weight"]["shape"] == [2, 16]


def test_plain_transformers_class_cannot_load_lumina_layout(folders):
    """The bug this fixture reproduces: transformers' class wants [num_heads, head_dim]."""
    from transformers import ChameleonForConditionalGeneration

    with pytest.raises(Exception, match="(?i)size|shape"):
        ChameleonForConditionalGeneration.from_pretrained(folders["lumina_mgpt"])


def test_both_lumina_layouts_load_to_the_same_network(models):
    ours, hf = models["lumina_mgpt"], models["lumina_mgpt_transformers"]
    for a, b in zip(ours.model.model.layers, hf.model.model.layers):
        for name in ("q_norm", "k_norm"):
            wa, wb = getattr(a.self_attn, name), getattr(b.self_attn, name)
            # Lumina's layout keeps its one row (it broadcasts over the heads in the layer norm);
            # transformers' layout stores it once per head: the same numbers.
            assert wa.weight.shape == (1, 16) and wb.weight.shape == (2, 16)
            assert torch.equal(wa.weight.expand_as(wb.weight), wb.weight)
            assert torch.equal(wa.bias.expand_as(wb.bias), wb.bias)
    ids = ours.encode_prompt(PROMPT).prompt_ids[None]
    with torch.no_grad():
        assert torch.equal(ours.model.model(input_ids=ids).last_hidden_state,
                           hf.model.model(input_ids=ids).last_hidden_state)
    a = sample(ours, "sjd_pac", "128x64", cfg=3.0, top_k=20, window=8)
    b = sample(hf, "sjd_pac", "128x64", cfg=3.0, top_k=20, window=8)
    assert torch.equal(a.tokens, b.tokens)


def test_lumina_layout_found_in_a_sharded_checkpoint_and_bad_rows_named(folders, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    src = folders["lumina_mgpt"]
    folder = tmp_path / "lumina-sharded"
    shutil.copytree(src, folder)
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    norms = {k: v for k, v in state.items() if "_norm." in k and "self_attn" in k}
    rest = {k: v for k, v in state.items() if k not in norms}
    save_file(rest, str(folder / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(norms, str(folder / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in rest}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in norms})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert lumina_mgpt.qk_norm_rows(folder) == 1
    # Rows that divide no head count: one sentence naming the fix, before the LLM weights are read.
    bad = {k: v.expand(3, -1).contiguous() for k, v in norms.items()}
    save_file(bad, str(folder / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr(lumina_mgpt, "load_pretrained", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(sp.ModelLoadError, match="q/k LayerNorm weights .* have 3 rows") as err:
        sp.load_model(folder, dtype="fp32", device="cpu")
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


# --- Lumina-mGPT: numbers pinned from the reference code -----------------------------------------
# Produced by running Lumina-mGPT's own code (github.com/Alpha-VLLM/Lumina-mGPT, lumina_mgpt/ and
# xllmx/, default branch) with transformers 4.47.1 in a throwaway environment on CPU in fp32, on
# the folder `build_lumina(seed=0)` writes (its own layout, loaded by its own Chameleon class with
# the [1, head_dim] q/k LayerNorm rows): FlexARItemProcessor(target_size=96) with an HF tokenizer
# made from the folder's text_tokenizer.json; prompt ids = process_item({"conversations":
# [human: "Generate an image of {W}x{H} according to the following prompt:\n" + PROMPT, gpt: None]})
# then <racm3:break> h w (their generate would sample those three; a random model cannot, so they
# were appended to the prompt); tokens = model.generate(prompt, GenerationConfig(do_sample=False,
# max_new_tokens=rows*(cols+1)+1, eos_token_id=[8710], output_scores=True), logits_processor=
# FlexARInferenceSolver.create_logits_processor(cfg, image_top_k=20)) - greedy, with their CFG,
# constraint and top-k processors; p = softmax of the processed scores at step t along that
# greedy path (the top three ids). The VQGAN pixels and the 768 crop-size list are in
# tests/data/lumina_mgpt_reference.json (same run; see its "produced_by").
LUMINA_PROMPT_IDS = {
    "128x64": [0, 9000, 9001, 9002, 9003, 9022, 9023, 9029, 9017, 9027, 9025, 9004, 9005, 9006, 9007,
               9008, 9018, 9009, 9010, 9011, 9012, 9006, 9013, 9016, 8710, 8197, 8806, 8808],
    "96x96": [0, 9000, 9001, 9002, 9003, 9030, 9027, 9017, 9030, 9027, 9004, 9005, 9006, 9007, 9008, 9018,
              9009, 9010, 9011, 9012, 9006, 9013, 9016, 8710, 8197, 8807, 8807],
}
LUMINA_TOKENS = {
    ("128x64", 3.0): [5946, 8047, 3136, 1088, 201, 7259, 4466, 3292, 8803, 4804, 2562, 1039, 4804, 2562, 1039,
                      4804, 2562, 8803, 4804, 2562, 1039, 4176, 721, 5687, 2728, 3914, 8803, 4804, 2562, 1039,
                      4804, 2562, 1039, 3851, 3851, 8803, 8196],
    ("128x64", 1.0): [3571, 3326, 624, 6025, 1067, 4824, 1587, 7222, 8803, 4804, 2562, 1039, 4176, 721, 5687,
                      3099, 482, 8803, 4804, 2562, 1039, 4176, 721, 3610, 5416, 5275, 8803, 4804, 2562, 1039,
                      4176, 2236, 3069, 2939, 5878, 8803, 8196],
    ("96x96", 3.0): [6399, 7685, 6497, 7611, 3070, 6726, 8803, 1947, 6365, 363, 6991, 2233, 241, 8803, 4804,
                     2562, 1039, 4804, 2562, 2442, 8803, 4804, 2562, 1039, 4176, 721, 5687, 8803, 4804, 2562,
                     1039, 4804, 2562, 1039, 8803, 4804, 2562, 1039, 4176, 2236, 3069, 8803, 8196],
    ("96x96", 1.0): [6536, 6365, 363, 6991, 2233, 241, 8803, 4804, 2562, 1039, 4176, 721, 5687, 8803, 4804,
                     2562, 1039, 4176, 721, 5687, 8803, 4804, 2562, 1039, 4176, 2236, 3069, 8803, 4804, 2562,
                     1039, 4176, 2236, 3069, 8803, 4804, 2562, 1039, 4176, 2236, 3069, 8803, 8196],
}
# (t, [top-3 ids], [their p]) along the greedy path at CFG 3, image top-k 20, temperature 1.
LUMINA_P = {
    "128x64": [(0, [5946, 3409, 6183], [0.3970157, 0.2658111, 0.131779]),
               (1, [8047, 4886, 1584], [0.5644646, 0.365269, 0.0322376]),
               (2, [3136, 747, 103], [0.844799, 0.1301128, 0.0152645]),
               (5, [7259, 5307, 2554], [0.422784, 0.1939934, 0.0931863]),
               (8, [8803, 1, 0], [1.0, 0.0, 0.0]),
               (9, [4804, 2092, 743], [0.9066643, 0.033337, 0.016374]),
               (35, [8803, 1, 0], [1.0, 0.0, 0.0]),
               (36, [8196, 1, 0], [1.0, 0.0, 0.0])],
    "96x96": [(0, [6399, 1041, 8131], [0.6631721, 0.2037712, 0.0405838]),
              (1, [7685, 4490, 2919], [0.4086635, 0.3128459, 0.1014235]),
              (2, [6497, 6685, 6802], [0.9412066, 0.0440406, 0.0126368]),
              (5, [6726, 6957, 7635], [0.8771152, 0.0522634, 0.0430762]),
              (6, [8803, 1, 0], [1.0, 0.0, 0.0]),
              (7, [1947, 4804, 2919], [0.5100248, 0.2830314, 0.0521059]),
              (41, [8803, 1, 0], [1.0, 0.0, 0.0]),
              (42, [8196, 1, 0], [1.0, 0.0, 0.0])],
}
# generate_crop_size_list((96 // 32) ** 2, 32): (width, height).
LUMINA_CROP_SIZES_96 = [(128, 32), (128, 64), (96, 64), (96, 96), (64, 96), (64, 128), (32, 128)]


def _reference_data() -> dict:
    return json.loads((DATA / "lumina_mgpt_reference.json").read_text())


def test_lumina_sizes_follow_the_reference_rule():
    assert set(lumina_mgpt.trained_sizes(96)) == set(LUMINA_CROP_SIZES_96)
    assert lumina_mgpt.trained_sizes(96)[0] == (96, 96)  # the square first: the default
    ref_768 = [tuple(s) for s in _reference_data()["crop_sizes_768"]]
    ours = lumina_mgpt.trained_sizes(768)
    assert ours[0] == (768, 768) and sorted(ours) == sorted(ref_768) and len(ours) == 73
    assert {(1024, 576), (576, 1024)} <= set(ours)


@pytest.mark.parametrize("resolution", ["128x64", "96x96"])
def test_lumina_prompt_ids_and_constraint_positions_match_the_reference(models, resolution):
    model = models["lumina_mgpt"]
    enc = model.encode_prompt(PROMPT, resolution=resolution)
    assert enc.prompt_ids.tolist() == LUMINA_PROMPT_IDS[resolution]
    assert enc.uncond_ids.tolist() == LUMINA_PROMPT_IDS[resolution][-3:]  # the image part alone
    # Forced positions: where the reference forces end-of-line (8803) and <eoss> (8196).
    ref = torch.tensor(LUMINA_TOKENS[(resolution, 3.0)])
    forced = enc.layout.forced_tokens()
    space = model.token_model.token_space
    is_forced = forced >= 0
    assert torch.equal(is_forced, (ref == 8803) | (ref == 8196))
    assert torch.equal(space[forced[is_forced]], ref[is_forced])


@pytest.mark.parametrize("resolution,cfg", list(LUMINA_TOKENS))
def test_lumina_greedy_tokens_match_the_reference(models, resolution, cfg):
    model = models["lumina_mgpt"]
    space = model.token_model.token_space
    expected = torch.tensor(LUMINA_TOKENS[(resolution, cfg)])
    for method, kw in (("ar", {}), ("sjd_pac", {"window": 8, "tree_width": 1})):
        result = sample(model, method, resolution, cfg=cfg, **kw)
        assert torch.equal(space[result.tokens], expected), (method, resolution, cfg)
    width, height = (int(v) for v in resolution.split("x"))
    assert result.images[0].size == (width, height)


@pytest.mark.parametrize("resolution", list(LUMINA_P))
def test_lumina_processed_p_matches_the_reference(models, resolution):
    assert_processed_p_matches(models["lumina_mgpt"], PROMPT, resolution, LUMINA_TOKENS[(resolution, 3.0)], 3.0,
                               LUMINA_P[resolution])


def test_lumina_vqgan_pixels_match_metas_code(models):
    """uint8 pixels of a fixed code grid: Meta's code truncates (x+1)/2*255. Float kernels differ
    in the last bits between implementations, so a value exactly at a level boundary may land one
    level off; rounding instead (the old bug) puts ~half of all values one level off."""
    ref = _reference_data()
    expected = np.frombuffer(zlib.decompress(base64.b64decode(ref["vqgan_uint8_zlib_b64"])), dtype=np.uint8)
    expected = expected.reshape(ref["vqgan_shape"]).astype(int)
    pixels = models["lumina_mgpt"].vqgan.decode_codes(torch.tensor([ref["vqgan_codes"]]))
    ours = np.asarray(pixels_to_pil(pixels)[0]).astype(int)
    assert ours.shape == expected.shape == (32, 48, 3)
    assert np.abs(ours - expected).max() <= 1 and (ours == expected).mean() > 0.995
    # Planted-bug control: rounding is caught.
    rounded = ((pixels[0].permute(1, 2, 0).clamp(-1, 1) + 1) * 127.5).round().numpy().astype(int)
    assert (rounded == expected).mean() < 0.9


# --- Emu3 and Janus-Pro against transformers' generate -------------------------------------------
_TRANSFORMERS_MODELS: Dict[Path, object] = {}


def transformers_model(folder: Path):
    """transformers' own model of the folder, loaded as its docs load it: whole (our loader drops
    and splits what sampling never uses), so the reference shares none of our loading."""
    from transformers import Emu3ForConditionalGeneration, JanusForConditionalGeneration

    if folder not in _TRANSFORMERS_MODELS:
        model_type = json.loads((folder / "config.json").read_text())["model_type"]
        cls = {"emu3": Emu3ForConditionalGeneration, "janus": JanusForConditionalGeneration}[model_type]
        _TRANSFORMERS_MODELS[folder] = cls.from_pretrained(folder, dtype=torch.float32).eval()
    return _TRANSFORMERS_MODELS[folder]


def _emu3_reference(model, folder: Path, resolution: str, cfg: float):
    """transformers' Emu3 image generation as its docs write it: the processor with
    return_for_image_generation, a negative prompt ending in the image prefix, the
    prefix_allowed_tokens_fn layout constraint, greedy."""
    processor, hf = model.processor, transformers_model(folder)
    size = model.sizes[resolution]
    kw = dict(return_for_image_generation=True, ratio=size.ratio, image_area=model.image_area, return_tensors="pt")
    inputs = processor(text=[PROMPT], **kw)
    height, width = (int(v) for v in inputs.pop("image_sizes")[0])
    neg = processor(text=[emu3_mod.DEFAULT_NEGATIVE_PROMPT], **kw)
    tok = processor.tokenizer
    wrapper = tok.convert_tokens_to_ids("<|image token|>")
    visual = hf.vocabulary_mapping.image_tokens
    eol, eof = tok.convert_tokens_to_ids("<|extra_200|>"), tok.convert_tokens_to_ids("<|extra_201|>")
    eoi, eos = tok.convert_tokens_to_ids("<|image end|>"), tok.eos_token_id

    def allowed(batch_id, input_ids):
        offset = input_ids.shape[0] - int(torch.nonzero(input_ids == wrapper)[0, 0])
        if offset % (width + 1) == 0:
            return [eol]
        for k, t in enumerate((eof, eoi, eos), start=1):
            if offset == (width + 1) * height + k:
                return [t]
        return visual

    n_new = height * (width + 1) + 3
    with torch.no_grad():
        out = hf.generate(**inputs, max_new_tokens=n_new, do_sample=False, prefix_allowed_tokens_fn=allowed,
                          guidance_scale=cfg if cfg > 1 else None,
                          negative_prompt_ids=neg.input_ids if cfg > 1 else None)
        tokens = out[0, inputs.input_ids.shape[1]:]
        pixels = hf.decode_image_tokens(image_tokens=tokens[None], height=height, width=width)
    images = processor.postprocess(list(pixels.float()), return_tensors="PIL.Image.Image")["pixel_values"]
    return tokens, images


def _janus_reference(model, folder: Path, cfg: float):
    """transformers' Janus image generation as its docs write it (batched CFG inside generate)."""
    processor, hf = model.processor, transformers_model(folder)
    messages = [{"role": "user", "content": [{"type": "text", "text": PROMPT}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(text=text, generation_mode="image", return_tensors="pt")
    with torch.no_grad():
        tokens = hf.generate(**inputs, generation_mode="image", do_sample=False, guidance_scale=cfg)
        pixels = hf.decode_image_tokens(tokens)
    # Channels first for postprocess: its PIL backend (no torchvision here) misreads [H, W, 3].
    images = processor.postprocess(list(pixels.permute(0, 3, 1, 2).float()),
                                   return_tensors="PIL.Image.Image")["pixel_values"]
    return tokens[0], images


@pytest.mark.parametrize("family,resolution,cfg", [
    ("emu3", "48x48", 3.0), ("emu3", "56x40", 3.0), ("emu3", "48x48", 1.0), ("janus", "96x96", 5.0),
])
def test_tokens_and_pixels_match_transformers_generate(models, folders, family, resolution, cfg):
    model = models[family]
    if family == "emu3":
        ref_tokens, ref_images = _emu3_reference(model, folders[family], resolution, cfg)
        to_model_ids = model.token_space
    else:
        ref_tokens, ref_images = _janus_reference(model, folders[family], cfg)
        to_model_ids = torch.arange(model.num_codes)
    for method, kw in (("ar", {}), ("sjd_pac", {"window": 8, "tree_width": 1})):
        result = sample(model, method, resolution, cfg=cfg, **kw)
        assert torch.equal(to_model_ids[result.tokens], ref_tokens), (family, method)
    width, height = (int(v) for v in resolution.split("x"))
    assert result.images[0].size == (width, height)
    assert np.array_equal(np.asarray(result.images[0]), np.asarray(ref_images[0]))


@pytest.fixture(scope="module")
def emu3_hub(tmp_path_factory):
    """Emu3 in BAAI/Emu3-Gen-hf's layout (Emu3-community/Emu3-Gen-hf is the same repository under its
    old name). Its config.json has no image_area, so the default 720x720 area is shrunk here."""
    from tiny_checkpoints import build_emu3_hub

    folder = build_emu3_hub(tmp_path_factory.mktemp("emu3_hub") / "emu3-gen")
    with pytest.MonkeyPatch.context() as mp:  # read once, while loading (the other tests need 720x720)
        mp.setattr(emu3_mod, "DEFAULT_IMAGE_AREA", 48 * 48)
        model = sp.load_model(folder, dtype="fp32", device="cpu")
    return folder, model


def test_emu3_hub_layout_loads_and_matches_transformers_generate(emu3_hub):
    folder, model = emu3_hub
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) == 2 and not (folder / "model.safetensors").exists()
    assert "text_model.lm_head.weight" in index and any(k.startswith("vqmodel.decoder.") for k in index)
    assert any(k.startswith("text_model.model.layers.1.") for k in index)
    config = json.loads((folder / "config.json").read_text())
    assert "image_area" not in config and "rope_scaling" in config["text_config"]
    assert type(model.processor.tokenizer).__name__ == "GPT2Tokenizer"
    assert not (folder / "processor_config.json").exists() and (folder / "preprocessor_config.json").is_file()
    assert model.defaults.resolutions == ("48x48", "56x40", "40x56", "64x32", "32x64")
    ref_tokens, ref_images = _emu3_reference(model, folder, "56x40", 3.0)
    for method, kw in (("ar", {}), ("sjd_pac", {"window": 8, "tree_width": 1})):
        result = sample(model, method, "56x40", cfg=3.0, **kw)
        assert torch.equal(model.token_space[result.tokens], ref_tokens), method
    assert result.images[0].size == (56, 40)
    assert np.array_equal(np.asarray(result.images[0]), np.asarray(ref_images[0]))
    # Sampled with top-k > 1, the seed-exact rule still gives ar == sjd_pac.
    ar = sample(model, "ar", "40x56", cfg=3.0, top_k=20, seed=2)
    pac = sample(model, "sjd_pac", "40x56", cfg=3.0, top_k=20, seed=2, window=8)
    assert torch.equal(ar.tokens, pac.tokens) and pac.images[0].size == (40, 56)


def test_processor_mean_and_std_come_from_the_checkpoint(models, folders):
    for family in ("emu3", "janus"):
        saved = {}
        for name in ("preprocessor_config.json", "processor_config.json"):
            if (folders[family] / name).is_file():
                data = json.loads((folders[family] / name).read_text())
                saved.update(data.get("image_processor", data))
        assert saved["image_mean"] == [0.5, 0.5, 0.5] and saved["image_std"] == [0.5, 0.5, 0.5], family
    model = models["emu3"]
    tokens = sample(model, "ar", "48x48", cfg=1.0).tokens
    before = np.asarray(model.decode(tokens, "48x48")[0]).astype(int)
    processor = model.processor.image_processor
    mean = processor.image_mean
    try:
        processor.image_mean = [0.25, 0.25, 0.25]  # a different config must change the pixels
        after = np.asarray(model.decode(tokens, "48x48")[0]).astype(int)
    finally:
        processor.image_mean = mean
    assert (after < before).mean() > 0.5


# --- every size, per family -------------------------------------------------------------------
def test_lumina_non_square_size(models):
    model = models["lumina_mgpt"]
    assert model.defaults.resolutions == tuple(f"{w}x{h}" for w, h in lumina_mgpt.trained_sizes(96))
    enc = model.encode_prompt(PROMPT, resolution="64x128")
    assert (enc.layout.rows, enc.layout.cols) == (8, 4) and enc.layout.num_tokens == 8 * 5 + 1
    assert enc.prompt_ids[-2:].tolist() == [8804 + 4, 8804 + 2]  # height 4 grids, then width 2
    result = sample(model, "sjd_pac", "64x128", cfg=3.0, top_k=20, window=8)
    assert result.images[0].size == (64, 128)
    assert model.decode(result.tokens)[0].size == (64, 128)  # the last encoded size when not told


def test_emu3_non_square_size(models):
    model = models["emu3"]
    assert len(model.defaults.resolutions) == 5 and model.defaults.resolution == "48x48"
    for resolution in model.defaults.resolutions:
        width, height = (int(v) for v in resolution.split("x"))
        size = model.sizes[resolution]
        assert (size.cols * 8, size.rows * 8) == (width, height)
    enc = model.encode_prompt(PROMPT, resolution="56x40")
    assert (enc.layout.rows, enc.layout.cols) == (5, 7) and enc.layout.num_tokens == 5 * 8 + 3
    tok = model.processor.tokenizer
    assert tok.convert_ids_to_tokens(enc.prompt_ids[-5:].tolist()) == ["<|image start|>", "5", "*", "7", "<|image token|>"]
    result = sample(model, "sjd_pac", "56x40", cfg=3.0, top_k=20, window=8)
    assert result.images[0].size == (56, 40)


def test_janus_offers_its_one_size_and_names_it(models):
    model = models["janus"]
    assert model.defaults.resolutions == ("96x96",)
    with pytest.raises(sp.ConfigError, match=r"does not support resolution 128x64; choose one of 96x96\.$"):
        model.encode_prompt(PROMPT, resolution="128x64")


def test_unsupported_lumina_size_lists_the_valid_ones(models):
    with pytest.raises(sp.ConfigError) as err:
        models["lumina_mgpt"].encode_prompt(PROMPT, resolution="100x100")
    message = str(err.value)
    assert "\n" not in message and message.endswith(".")
    assert all(f"{w}x{h}" in message for w, h in LUMINA_CROP_SIZES_96)


# --- the float32 path (Apple MPS) ------------------------------------------------------------------
def test_compute_dtype():
    assert verify.compute_dtype(torch.device("cpu")) == torch.float64
    assert verify.compute_dtype(torch.device("mps")) == torch.float32
    assert verify.compute_dtype("cuda") == torch.float64


@pytest.fixture
def float32_everywhere(monkeypatch):
    monkeypatch.setattr(verify, "compute_dtype", lambda device: torch.float32)


def test_float32_gumbel_noise_is_finite_and_standard(float32_everywhere):
    noise = verify.gumbel_noise(7, torch.arange(64), 4096)
    assert noise.dtype == torch.float32 and torch.isfinite(noise).all()
    # Standard Gumbel: mean = Euler's constant, variance = pi^2 / 6 (262144 draws).
    assert abs(float(noise.mean()) - 0.5772) < 0.01 and abs(float(noise.var()) - 1.6449) < 0.02
    top = torch.tensor([0xFFFFFFFF, 0], dtype=torch.long)
    u = ((top >> 9).float() + 0.5) / 8388608.0
    assert float(u.max()) < 1.0 and float(u.min()) > 0.0


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    from scipy.stats import chisquare

    probs, counts = np.asarray(probs, dtype=np.float64), np.asarray(counts, dtype=np.float64)
    keep = probs > 0
    assert counts[~keep].sum() == 0  # nothing drawn outside the support
    return float(chisquare(counts[keep], probs[keep] / probs[keep].sum() * counts.sum()).pvalue)


def test_float32_gumbel_argmax_draws_exactly_from_p(float32_everywhere):
    """The seed-exact rule's float32 noise: argmax(log p + G_t) over 40000 positions ~ p."""
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.04, 0.01, 0.0])
    n = 40000
    noise = verify.gumbel_noise(11, torch.arange(n), probs.shape[0])
    tokens = verify.gumbel_argmax(probs.expand(n, -1), noise)
    counts = np.bincount(tokens.numpy(), minlength=probs.shape[0])
    assert _chi_square_p(counts, probs.numpy()) > 1e-3
    # Planted-bug control: uniform instead of Gumbel noise is caught with the same sample size.
    wrong = verify.gumbel_argmax(probs.expand(n, -1), torch.rand(n, probs.shape[0], generator=torch.Generator().manual_seed(0)))
    assert _chi_square_p(np.bincount(wrong.numpy(), minlength=probs.shape[0]), probs.numpy()) < 1e-3


def test_float32_draws_without_replacement_are_plackett_luce(float32_everywhere):
    """Tree candidates in float32: ordered pairs (a, b) drawn with probability
    q_a q_b / (1 - q_a) over q without the excluded token; 20000 draws."""
    q = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    exclude = torch.tensor([False, False, False, True, False])
    rest = q.masked_fill(exclude, 0.0)
    rest = rest / rest.sum()
    gen = torch.Generator().manual_seed(5)
    # The sampler's draw: the row's first token (here the excluded one), then two more from q without it.
    firsts = exclude.nonzero().flatten().expand(20000)
    pairs = verify.sample_without_replacement_rows(q.expand(20000, -1), firsts, 3, gen)[:, 1:].numpy()
    v = q.shape[0]
    counts = np.bincount(pairs[:, 0] * v + pairs[:, 1], minlength=v * v)
    r = rest.double().numpy()
    exact = np.array([r[a] * r[b] / (1 - r[a]) if a != b else 0.0 for a in range(v) for b in range(v)])
    assert _chi_square_p(counts, exact) > 1e-3
    # Planted-bug control: the top-2 of q plus uniform noise is not a draw without replacement.
    biased = np.stack([torch.topk(q.log().masked_fill(exclude, -np.inf) + torch.rand(v, generator=gen), 2).indices.numpy()
                       for _ in range(20000)])
    assert _chi_square_p(np.bincount(biased[:, 0] * v + biased[:, 1], minlength=v * v), exact) < 1e-3


@pytest.mark.slow
def test_float32_path_keeps_the_exact_distribution(float32_everywhere):
    """End to end: SJD-PAC (tree width 3, window 8) against the exact joint, with the exactness
    tests' own case and sample count, every random draw in float32."""
    import exactness_tools as tools
    import test_exactness as ex

    config, constraints, samples = ex.CASES["sjd_pac_K3_D3_L8"]
    p_value, tv, noise = tools.joint_check(tools.tiny_joint(), config, samples, constraints=constraints)
    assert p_value > tools.P_VALUE_MIN and tv < tools.TV_FACTOR * noise, (p_value, tv, noise)


def test_float32_path_is_seed_exact(float32_everywhere, models):
    model = models["janus"]
    ar = sample(model, "ar", "96x96", cfg=5.0, top_k=20, seed=3)
    pac = sample(model, "sjd_pac", "96x96", cfg=5.0, top_k=20, seed=3, window=16, tree_width=3)
    assert torch.equal(ar.tokens, pac.tokens)


def test_static_size_lists_match_the_families(models):
    """The lists made before a checkpoint is loaded (the ComfyUI node's) hold every family's sizes."""
    from sjd_pac_core.models import sizes

    processor = models["emu3"].processor
    emu3 = []
    for ratio in emu3_mod.RATIOS:
        rows, cols = processor.calculate_generate_size(ratio, emu3_mod.DEFAULT_IMAGE_AREA, 8)
        emu3.append(f"{cols * 8}x{rows * 8}")
    assert tuple(emu3) == sizes.EMU3_RESOLUTIONS
    known = set(sizes.known_resolutions())
    assert {"64x64", "384x384", "512x512", "768x768", "1024x1024", "1024x576", "576x1024", "960x544"} <= known
