"""The loader's last bad inputs, one table per cause: each row is one sentence of the library's own
type (ModelLoadError / ConfigError), raised before any weight is read or any forward pass runs; an
input we accept instead gives exactly the canonical input's result.

Causes: a Chameleon vqgan.ckpt that is more than tensors (never unpickled), sliding-window models
(exact only inside the window), damaged safetensors headers and weight files that are not files,
config.json values no model can be built from, devices that cannot run a model, prompts that are
not text, and tokens another model sampled handed to decode.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import sjd_pac_core as sp
from sjd_pac_core.models import chameleon_vqgan, loader, lumina_mgpt
from tiny_checkpoints import build_emu3, build_janus, build_lumina

torch.set_num_threads(1)
pytestmark = pytest.mark.usefixtures("tiny_lumina_sizes")


def one_sentence(message: str) -> None:
    assert message.count(". ") == 0 and message.endswith(".") and "\n" not in message, message


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("loader_inputs")
    return {"emu3": build_emu3(root / "emu3"), "lumina_mgpt": build_lumina(root / "lumina"),
            "janus": build_janus(root / "janus")}


def copy_of(built, family: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built[family], tmp_path / family))


def copy_with_config(built, family: str, tmp_path: Path, change) -> Path:
    """A copy of the family's tiny checkpoint whose config.json `change` has edited in place."""
    folder = copy_of(built, family, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def assert_load_refused(folder: Path, needles: List[str]) -> None:
    """load_model refuses the folder in one sentence that names it and says every needle."""
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(folder, dtype="fp32", device="cpu")
    message = str(err.value)
    assert type(err.value) is sp.ModelLoadError and str(folder) in message
    for needle in needles:
        assert needle in message, message
    one_sentence(message)


# --- 1. the Chameleon VQGAN is never unpickled -------------------------------------------------
class Planted:
    """A pickled object whose unpickling creates a file: what a crafted checkpoint can do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _vqgan_state(folder: Path) -> Dict[str, torch.Tensor]:
    return torch.load(folder / "vqgan.ckpt", weights_only=True)["state_dict"]


def test_a_vqgan_ckpt_with_planted_code_is_refused_and_runs_nothing(built, tmp_path, monkeypatch):
    folder = copy_of(built, "lumina_mgpt", tmp_path)
    marker = tmp_path / "planted-code-ran"
    torch.save({"state_dict": _vqgan_state(folder), "callbacks": Planted(marker)}, folder / "vqgan.ckpt")
    monkeypatch.setattr(lumina_mgpt, "load_pretrained", lambda *a, **k: pytest.fail("LLM weights loaded"))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(folder, dtype="fp32", device="cpu")
    message = str(err.value)
    assert not marker.exists()
    assert type(err.value) is sp.ModelLoadError and "vqgan.ckpt holds Python objects besides tensors" in message
    assert "never unpickles" in message and "vqgan.safetensors" in message
    one_sentence(message)
    # The control: the file really runs its code when it is fully unpickled.
    torch.load(folder / "vqgan.ckpt", weights_only=False)
    assert marker.exists()


def test_a_vqgan_ckpt_with_plain_metadata_loads_and_one_with_objects_is_refused(built, tmp_path):
    import argparse

    folder = copy_of(built, "lumina_mgpt", tmp_path)
    state = _vqgan_state(folder)
    # A Lightning-style checkpoint of plain values: read by the weights-only loader.
    torch.save({"epoch": 3, "global_step": 1200, "pytorch-lightning_version": "1.4.2",
                "lr_schedulers": [{"last_epoch": 3, "base_lrs": [4.5e-06]}], "state_dict": state}, folder / "vqgan.ckpt")
    model = sp.load_model(folder, dtype="fp32", device="cpu")
    assert torch.equal(model.vqgan.quantize.embedding.weight, state["quantize.embedding.weight"])
    # Hyper-parameters pickled as a class instance (as some trainers save them): refused.
    torch.save({"hyper_parameters": argparse.Namespace(lr=1.0), "state_dict": state}, folder / "vqgan.ckpt")
    with pytest.raises(sp.ModelLoadError, match="holds Python objects besides tensors") as err:
        sp.load_model(folder, dtype="fp32", device="cpu")
    one_sentence(str(err.value))


def test_the_conversion_command_makes_a_vqgan_safetensors_that_is_read_first(built, tmp_path):
    folder = copy_of(built, "lumina_mgpt", tmp_path)
    reference = sp.load_model(built["lumina_mgpt"], dtype="fp32", device="cpu")
    command = chameleon_vqgan.CONVERT_COMMAND
    assert command.startswith('python -c "') and command.endswith('"')
    subprocess.run([sys.executable, "-c", command[len('python -c "'):-1]], cwd=folder, check=True)
    assert (folder / "vqgan.safetensors").is_file()
    marker = tmp_path / "planted-code-ran"
    torch.save({"state_dict": _vqgan_state(folder), "x": Planted(marker)}, folder / "vqgan.ckpt")
    model = sp.load_model(folder, dtype="fp32", device="cpu")  # the safetensors copy, not the .ckpt
    assert not marker.exists()
    tokens = sp.generate_image(reference, "a red cat", config=reference.defaults.sampler_config(verify="gumbel"),
                               seed=0, resolution="96x96").tokens
    assert np.array_equal(np.asarray(model.decode(tokens, "96x96")[0]), np.asarray(reference.decode(tokens, "96x96")[0]))
    # A damaged copy is one sentence too.
    data = (folder / "vqgan.safetensors").read_bytes()
    (folder / "vqgan.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(sp.ModelLoadError, match="vqgan.safetensors is truncated") as err:
        sp.load_model(folder, dtype="fp32", device="cpu")
    one_sentence(str(err.value))


# --- 2. sliding-window attention ---------------------------------------------------------------
PROMPT = torch.tensor([1, 2, 3])
N = 30


def tiny_lm(cls, config_cls, **fields):
    torch.manual_seed(0)
    config = config_cls(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, **fields)
    model = cls(config).eval()
    with torch.no_grad():  # peaked conditionals that depend on the whole prefix
        model.lm_head.weight.mul_(30.0)
        model.model.embed_tokens.weight.mul_(3.0)
    return model


def greedy_reference(model) -> torch.Tensor:
    out = model.generate(PROMPT[None], max_new_tokens=N, min_new_tokens=N, do_sample=False)
    return out[0, PROMPT.numel():]


def greedy_ours(model, method: str) -> torch.Tensor:
    config = sp.SamplerConfig(method=method, verify="gumbel", top_k=1, window=4)
    return sp.sample_tokens(model, PROMPT, N, config=config, seed=0).tokens


WINDOW_REFUSED = [
    ("Mistral, window 8", lambda: tiny_lm(MistralForCausalLM, MistralConfig, sliding_window=8)),
    ("Qwen2, window 8 on its upper layer", lambda: tiny_lm(Qwen2ForCausalLM, Qwen2Config, use_sliding_window=True,
                                                             sliding_window=8, max_window_layers=1)),
    ("Mistral, window shorter than the run's cache", lambda: tiny_lm(MistralForCausalLM, MistralConfig,
                                                                      sliding_window=100)),
    # transformers' generate applies even a stray key (its masks read any config's sliding_window)
    ("Llama with a sliding_window key", lambda: tiny_lm(LlamaForCausalLM, LlamaConfig, sliding_window=8)),
]


@pytest.mark.parametrize("build", [r[1] for r in WINDOW_REFUSED], ids=[r[0] for r in WINDOW_REFUSED])
@pytest.mark.parametrize("method", ["ar", "sjd_pac"])
def test_a_run_past_the_sliding_window_is_refused_before_any_pass(build, method):
    model = build()
    calls: List[int] = []
    model.register_forward_pre_hook(lambda *a, **k: calls.append(1), with_kwargs=True)
    with pytest.raises(sp.ConfigError) as err:
        greedy_ours(model, method)
    message = str(err.value)
    assert type(err.value) is sp.ConfigError and "uses sliding-window attention over" in message
    assert "a run that fits in the window is exact" in message
    one_sentence(message)
    assert calls == []


WINDOW_ACCEPTED = [
    ("Mistral without a window", lambda: tiny_lm(MistralForCausalLM, MistralConfig, sliding_window=None)),
    ("Mistral, window past the context", lambda: tiny_lm(MistralForCausalLM, MistralConfig, sliding_window=4096)),
    ("Mistral, window that holds the whole run", lambda: tiny_lm(MistralForCausalLM, MistralConfig,
                                                                  sliding_window=200)),
    ("Qwen2, use_sliding_window off", lambda: tiny_lm(Qwen2ForCausalLM, Qwen2Config, sliding_window=8)),
    ("Llama", lambda: tiny_lm(LlamaForCausalLM, LlamaConfig)),
]


@pytest.mark.parametrize("build", [r[1] for r in WINDOW_ACCEPTED], ids=[r[0] for r in WINDOW_ACCEPTED])
@pytest.mark.parametrize("method", ["ar", "sjd", "sjd_pac"])
def test_an_accepted_window_gives_the_models_own_greedy_tokens(build, method):
    model = build()
    assert torch.equal(greedy_ours(model, method), greedy_reference(model))


@pytest.mark.parametrize("build", [r[1] for r in WINDOW_REFUSED], ids=[r[0] for r in WINDOW_REFUSED])
def test_the_refused_windows_really_change_what_the_model_computes(build):
    # The control, with the check switched off: our logits over a 120-token prompt differ from the
    # model's own forward, or (where its forward ignores the key) our tokens from its generate.
    model = build()
    adapter = sp.CausalLMAdapter(model)
    adapter.sliding_window = None
    prompt = torch.randint(0, 32, (120,), generator=torch.Generator().manual_seed(1))
    session = adapter.open_session([prompt])
    ours = session.prefill()[0]
    session.close()
    own_forward = model(prompt[None]).logits[0, -1]
    config = sp.SamplerConfig(method="ar", verify="gumbel", top_k=1)
    tokens = sp.sample_tokens(adapter, PROMPT, N, config=config, seed=0).tokens
    assert not torch.allclose(ours, own_forward, atol=1e-3) or not torch.equal(tokens, greedy_reference(model))


def test_the_control_agrees_without_a_window():
    model = tiny_lm(MistralForCausalLM, MistralConfig, sliding_window=None)
    prompt = torch.randint(0, 32, (120,), generator=torch.Generator().manual_seed(1))
    session = sp.CausalLMAdapter(model).open_session([prompt])
    assert torch.allclose(session.prefill()[0], model(prompt[None]).logits[0, -1], atol=1e-3)


def _janus_with_window(built, tmp_path, window: int) -> Path:
    def mistral_body(config):  # the same weights, a Mistral body
        config["text_config"].update(model_type="mistral", sliding_window=window)
    return copy_with_config(built, "janus", tmp_path, mistral_body)


def test_load_model_refuses_a_window_shorter_than_any_image(built, tmp_path, no_weights):
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(_janus_with_window(built, tmp_path, 8), dtype="fp32", device="cpu")
    message = str(err.value)
    assert "sliding-window attention over 8 positions" in message and "smallest image needs 37 positions" in message
    one_sentence(message)


def test_a_family_window_is_checked_per_run_and_a_covering_one_is_exact(built, tmp_path):
    base = sp.load_model(built["janus"], dtype="fp32", device="cpu")
    config = base.defaults.sampler_config(verify="gumbel", top_k=5)
    short = sp.load_model(_janus_with_window(built, tmp_path / "short", 40), dtype="fp32", device="cpu")
    with pytest.raises(sp.ConfigError, match="over 40 positions.*this run reserves") as err:
        sp.generate_image(short, "a red cat", config=config, seed=1)
    one_sentence(str(err.value))
    wide = sp.load_model(_janus_with_window(built, tmp_path / "wide", 4096), dtype="fp32", device="cpu")
    assert type(wide.model.model.language_model).__name__ == "MistralModel"
    assert torch.equal(sp.generate_image(wide, "a red cat", config=config, seed=1).tokens,
                       sp.generate_image(base, "a red cat", config=config, seed=1).tokens)


# --- 3. weight files -----------------------------------------------------------------------------
Q_PROJ = "layers.0.self_attn.q_proj.weight"


def _header(path: Path):
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return data, length, json.loads(data[8 : 8 + length])


def _write_header(path: Path, text: str) -> None:
    data, length, _ = _header(path)
    raw = text.encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])


def _set_dtype(folder: Path, dtype: str, file: str = "model.safetensors", suffix: str = Q_PROJ) -> str:
    path = folder / file
    _, _, header = _header(path)
    key = next(k for k in header if k.endswith(suffix))
    header[key]["dtype"] = dtype
    _write_header(path, json.dumps(header))
    return key


def _fault_unknown_dtype(folder: Path):
    key = _set_dtype(folder, "F31")
    return ["model.safetensors stores the weight", key, "as 'F31', which is not a safetensors data type"]


def _fault_dtype_of_another_width(folder: Path):
    key = _set_dtype(folder, "F16")
    return ["model.safetensors gives the weight", key, "(F16, shape [32, 32]) 4,096 bytes", "take 2,048"]


def _fault_integer_dtype_of_the_same_width(folder: Path):
    key = _set_dtype(folder, "I32")  # the same 4 bytes per value: nothing else notices
    return ["model.safetensors stores the weight", key, "as I32 (integers)", "holds it in floating point"]


def _fault_bool_dtype(folder: Path):
    key = _set_dtype(folder, "BOOL")
    return ["model.safetensors gives the weight", key, "(BOOL, shape [32, 32])"]


def _fault_duplicated_name(folder: Path):
    path = folder / "model.safetensors"
    _, _, header = _header(path)
    key = next(k for k in header if k.endswith(Q_PROJ))
    text = json.dumps(header)
    _write_header(path, text[:-1] + ", " + json.dumps({key: header[key]})[1:])  # the key twice
    return ["model.safetensors names the weight", key, "twice in its header"]


def _fault_overlapping_data(folder: Path):
    path = folder / "model.safetensors"
    _, _, header = _header(path)
    names = sorted((v["data_offsets"][0], k) for k, v in header.items() if k != "__metadata__")
    first, second = header[names[0][1]], header[names[1][1]]
    if first["shape"] == second["shape"] and first["dtype"] == second["dtype"]:
        second["data_offsets"] = list(first["data_offsets"])
    else:  # point the second at the first one's bytes with its own length
        length = second["data_offsets"][1] - second["data_offsets"][0]
        second["data_offsets"] = [0, length]
    _write_header(path, json.dumps(header))
    return ["model.safetensors has weights whose data overlap or leave gaps"]


def _fault_bytes_after_the_last_weight(folder: Path):
    with open(folder / "model.safetensors", "ab") as f:
        f.write(b"\0" * 64)
    return ["model.safetensors has 64 bytes after its last weight"]


def _fault_weight_file_is_a_folder(folder: Path):
    (folder / "extra.safetensors").mkdir()
    return ["extra.safetensors is a folder, not a weight file"]


def _fault_model_safetensors_is_a_folder(folder: Path):
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").mkdir()
    return ["model.safetensors is a folder, not a weight file"]


def _fault_broken_link(folder: Path):
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to(folder / "gone" / "model.safetensors")
    return ["model.safetensors is a link to", "which does not exist", "fix the link"]


WEIGHT_FAULTS = {
    "unknown dtype": _fault_unknown_dtype,
    "dtype of another width (F32 -> F16)": _fault_dtype_of_another_width,
    "integer dtype of the same width (F32 -> I32)": _fault_integer_dtype_of_the_same_width,
    "bool dtype": _fault_bool_dtype,
    "a tensor named twice": _fault_duplicated_name,
    "overlapping data": _fault_overlapping_data,
    "bytes after the last weight": _fault_bytes_after_the_last_weight,
    "a *.safetensors folder": _fault_weight_file_is_a_folder,
    "model.safetensors a folder": _fault_model_safetensors_is_a_folder,
    "model.safetensors a broken link": _fault_broken_link,
}


@pytest.mark.parametrize("fault", list(WEIGHT_FAULTS), ids=list(WEIGHT_FAULTS))
def test_weight_file_faults_are_one_sentence_before_any_weight_is_read(built, tmp_path, fault, monkeypatch):
    folder = copy_of(built, "emu3", tmp_path)
    needles = WEIGHT_FAULTS[fault](folder)
    import transformers

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were read before the files were checked")

    monkeypatch.setattr(transformers.Emu3ForConditionalGeneration, "from_pretrained", forbidden)
    assert_load_refused(folder, needles)


def test_integer_buffers_of_the_model_stay_accepted(built):
    # Emu3's VQ holds BatchNorm counters (I64) in the file: the dtype check must not refuse them.
    _, _, header = _header(built["emu3"] / "model.safetensors")
    assert any(v["dtype"] == "I64" for k, v in header.items() if k != "__metadata__")
    assert sp.load_model(built["emu3"], dtype="fp32", device="cpu").family == "emu3"


def test_a_link_to_the_weights_loads_like_the_file(built, tmp_path):
    folder = copy_of(built, "emu3", tmp_path)
    (folder / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (folder / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    model = sp.load_model(folder, dtype="fp32", device="cpu")
    base = sp.load_model(built["emu3"], dtype="fp32", device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(model.model.state_dict().values(), base.model.state_dict().values()))


@pytest.mark.parametrize("file,key", [("model.safetensors", "model.layers.0.mlp.up_proj.weight"),
                                      ("vq.safetensors", None)])
def test_demo_weights_stored_as_integers_name_the_rebuild(tmp_path, file, key):
    copy = Path(shutil.copytree(loader.DEMO_FOLDER, tmp_path / "demo"))
    if key is None:
        _, _, header = _header(copy / file)
        key = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    _set_dtype(copy, "I32", file, key)
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy, device="cpu")
    message = str(err.value)
    assert f"{file} stores the weight {key} as I32 (integers)" in message
    assert "python -m sjd_pac_core.demo.tools.train" in message
    one_sentence(message)


# --- 4. config.json values -----------------------------------------------------------------------
def _text(key, value):
    def change(config):
        config["text_config"][key] = value
    return change


def _top(key, value):
    def change(config):
        config[key] = value
    return change


def _vocabulary_entry(name, value):
    def change(config):
        config["vocabulary_map"][name] = value
    return change


def _part(section, key, value):
    def change(config):
        config[section][key] = value
    return change


CONFIG_FAULTS = [
    ("vocab_size negative", _text("vocab_size", -1), "sets text_config.vocab_size to -1, which is not a whole number"),
    ("vocab_size zero", _text("vocab_size", 0), "sets text_config.vocab_size to 0"),
    ("vocab_size fraction", _text("vocab_size", 2.5), "sets text_config.vocab_size to 2.5"),
    ("vocab_size text", _text("vocab_size", "64"), "sets text_config.vocab_size to '64'"),
    ("vocab_size bool", _text("vocab_size", True), "sets text_config.vocab_size to True"),
    ("heads zero", _text("num_attention_heads", 0), "sets text_config.num_attention_heads to 0"),
    ("heads negative", _text("num_attention_heads", -2), "sets text_config.num_attention_heads to -2"),
    ("heads float", _text("num_attention_heads", 2.0), "sets text_config.num_attention_heads to 2.0"),
    ("heads not dividing the width", _text("num_attention_heads", 3),
     "sets text_config.hidden_size = 32 with 3 attention heads, which do not divide it"),
    ("key/value heads not dividing the heads", _text("num_key_value_heads", 3),
     "sets text_config.num_attention_heads = 2, which 3 key/value heads do not divide"),
    ("layers zero", _text("num_hidden_layers", 0), "sets text_config.num_hidden_layers to 0"),
    ("context negative", _text("max_position_embeddings", -5), "sets text_config.max_position_embeddings to -5"),
    ("text_config a list", _top("text_config", [1, 2]), "has a text_config that is a JSON list"),
    ("vocabulary_map a list", _top("vocabulary_map", [["a", 1]]), "has a vocabulary_map that is a JSON list"),
    ("vocabulary_map a str id", _vocabulary_entry("lowres", "7"), "maps the token 'lowres' to '7' in vocabulary_map"),
    ("vocabulary_map a float id", _vocabulary_entry("lowres", 7.5), "maps the token 'lowres' to 7.5"),
    ("vocabulary_map a bool id", _vocabulary_entry("lowres", True), "maps the token 'lowres' to True"),
    ("vocabulary_map a negative id", _vocabulary_entry("lowres", -1), "maps the token 'lowres' to the id -1"),
    ("vocabulary_map an id past the vocabulary", _vocabulary_entry("lowres", 10**9),
     "maps the token 'lowres' to the id 1000000000 in vocabulary_map, outside the vocabulary of"),
    ("vocab_size null", _text("vocab_size", None), "sets text_config.vocab_size to null, but a model needs its size"),
    ("model_type a list", _top("model_type", ["emu3"]), "sets model_type to ['emu3'], which is not a name"),
    ("vq_config a list", _top("vq_config", [1]), "has a vq_config that is a JSON list"),
    ("codebook_size zero", _part("vq_config", "codebook_size", 0), "sets vq_config.codebook_size to 0"),
    ("codebook_size text", _part("vq_config", "codebook_size", "64"), "sets vq_config.codebook_size to '64'"),
    ("channel_multiplier empty", _part("vq_config", "channel_multiplier", []),
     "sets vq_config.channel_multiplier to [], which is not a list of 1 to 10 whole numbers"),
    ("image_area zero", _top("image_area", 0), "sets image_area to 0, which is not a whole number"),
    ("image_area text", _top("image_area", "2304"), "sets image_area to '2304', which is not a whole number"),
    ("image_area null", _top("image_area", None), "sets image_area to null"),
    ("image_area under one token", _top("image_area", 7), "sets image_area to 7 pixels, too small for a 1:1 image"),
    ("layers 100000", _text("num_hidden_layers", 100000), "sets text_config.num_hidden_layers to 100,000, far more"),
    ("VQ blocks 100000", _part("vq_config", "num_res_blocks", 100000), "sets vq_config.num_res_blocks to 100,000"),
]


def assert_refused_before_building(folder: Path, needle: str) -> None:
    """load_model and memory_plan both refuse the edited config.json in one sentence that names it and
    says `needle`, before any model is built."""
    for call in (lambda: sp.load_model(folder, dtype="fp32", device="cpu"), lambda: sp.memory_plan(folder)):
        with pytest.raises(sp.ModelLoadError) as err:
            call()
        message = str(err.value)
        assert type(err.value) is sp.ModelLoadError and str(folder / "config.json") in message
        assert needle in message, message
        one_sentence(message)


@pytest.mark.parametrize("change,needle", [r[1:] for r in CONFIG_FAULTS], ids=[r[0] for r in CONFIG_FAULTS])
def test_config_values_are_one_sentence_before_any_model_is_built(built, tmp_path, no_weights, change, needle):
    assert_refused_before_building(copy_with_config(built, "emu3", tmp_path, change), needle)


LUMINA_CONFIG_FAULTS = [
    ("lumina heads zero", _top("num_attention_heads", 0), "sets num_attention_heads to 0"),
    ("lumina vocab negative", _top("vocab_size", -3), "sets vocab_size to -3"),
    ("lumina id past the vocabulary", _vocabulary_entry("<racm3:break>", 70000),
     "to the id 70000 in vocabulary_map, outside the vocabulary of 65536"),
    ("lumina vocab null", _top("vocab_size", None), "sets vocab_size to null"),
    ("lumina VQ levels empty", _part("vq_config", "ch_mult", []), "sets vq_config.ch_mult to []"),
]


@pytest.mark.parametrize("change,needle", [r[1:] for r in LUMINA_CONFIG_FAULTS],
                         ids=[r[0] for r in LUMINA_CONFIG_FAULTS])
def test_lumina_config_values_are_one_sentence(built, tmp_path, no_weights, change, needle):
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy_with_config(built, "lumina_mgpt", tmp_path, change), dtype="fp32", device="cpu")
    assert needle in str(err.value), str(err.value)
    one_sentence(str(err.value))


JANUS_CONFIG_FAULTS = [
    ("vision_config a list", _top("vision_config", [1]), "has a vision_config that is a JSON list"),
    ("image_size text", _part("vision_config", "image_size", "96"), "sets vision_config.image_size to '96'"),
    ("patch_size zero", _part("vision_config", "patch_size", 0), "sets vision_config.patch_size to 0"),
    ("image tokens not the grid", _part("vision_config", "num_image_tokens", 35),
     "gives a 6x6 grid, but num_image_tokens is 35"),
    ("vision layers 100000", _part("vision_config", "num_hidden_layers", 100000),
     "sets vision_config.num_hidden_layers to 100,000"),
    ("channel_multiplier text", _part("vq_config", "channel_multiplier", "11111"),
     "sets vq_config.channel_multiplier to '11111'"),
    ("num_embeddings zero", _part("vq_config", "num_embeddings", 0), "sets vq_config.num_embeddings to 0"),
    ("vocab_size null", _text("vocab_size", None), "sets text_config.vocab_size to null"),
]


@pytest.mark.parametrize("change,needle", [r[1:] for r in JANUS_CONFIG_FAULTS], ids=[r[0] for r in JANUS_CONFIG_FAULTS])
def test_janus_image_parts_are_one_sentence_before_any_model_is_built(built, tmp_path, no_weights, change, needle):
    assert_refused_before_building(copy_with_config(built, "janus", tmp_path, change), needle)


# --- the small files beside the weights: each a JSON object, not nested past reading ------------------
DEEP = "[" * 100000 + "]" * 100000  # Python's JSON reader gives up with a RecursionError


def _nested(name):
    def change(folder: Path):
        path = folder / name
        text = path.read_text().rstrip() if path.is_file() else "{}"
        path.write_text(text[:-1] + (", " if text.strip() != "{}" else "") + f'"deep": {DEEP}}}')
        return [f"{name} nests its JSON too deeply to be read", "download it again"]
    return change


def _a_list(name):
    def change(folder: Path):
        (folder / name).write_text("[1, 2]")
        return [f"{name} holds a JSON list, not an object of settings"]
    return change


def _metadata(value):
    def change(folder: Path):
        path = folder / "model.safetensors"
        data = path.read_bytes()
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        header["__metadata__"] = value
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])
        return ["model.safetensors has a __metadata__ entry that is not a table of text values"]
    return change


def _deep_header(folder: Path):
    path = folder / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    text = data[8:8 + length].rstrip()[:-1] + b', "__metadata__": {"x": ' + DEEP.encode() + b"}}"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length:])
    return ["model.safetensors has a safetensors header nested too deeply to be read"]


def _empty_index(delete_weights: bool):
    def change(folder: Path):
        (folder / loader.INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": {}}))
        if delete_weights:
            (folder / "model.safetensors").unlink()
        return ["model.safetensors.index.json names no weight at all"]
    return change


def _vqgan_yaml(change, needle):
    def fault(folder: Path):
        path = folder / "vqgan.yaml"
        path.write_text(change(path.read_text()))
        return [f"vqgan.yaml {needle}"]
    return fault


FILE_FAULTS = [
    ("emu3", "generation_config.json a list", _a_list("generation_config.json")),
    ("janus", "generation_config.json a list", _a_list("generation_config.json")),
    ("lumina_mgpt", "generation_config.json a list", _a_list("generation_config.json")),
    ("emu3", "config.json nested", _nested("config.json")),
    ("emu3", "tokenizer_config.json nested", _nested("tokenizer_config.json")),
    ("emu3", "tokenizer.json nested", _nested("tokenizer.json")),
    ("emu3", "processor_config.json nested", _nested("processor_config.json")),
    ("emu3", "generation_config.json nested", _nested("generation_config.json")),
    ("janus", "chat_template.json nested", _nested("chat_template.json")),
    ("emu3", "__metadata__ a list", _metadata([1, 2])),
    ("emu3", "__metadata__ a number", _metadata({"format": 3})),
    ("emu3", "safetensors header nested", _deep_header),
    ("emu3", "empty shard index", _empty_index(delete_weights=False)),
    ("emu3", "empty shard index alone", _empty_index(delete_weights=True)),
    ("lumina_mgpt", "vqgan.yaml nested", _vqgan_yaml(lambda text: f"a: {DEEP}\n",
                                                     "is not a Chameleon vqgan.yaml (RecursionError")),
    ("lumina_mgpt", "vqgan.yaml 100000 blocks", _vqgan_yaml(lambda text: re.sub(r"num_res_blocks: *\d+",
                                                                                "num_res_blocks: 100000", text),
                                                            "describes no VQGAN that can be built")),
]


@pytest.mark.parametrize("family,fault", [r[0::2] for r in FILE_FAULTS], ids=[f"{r[0]} {r[1]}" for r in FILE_FAULTS])
def test_damaged_small_files_are_one_sentence_before_any_weight_is_read(built, tmp_path, no_weights, family, fault):
    folder = copy_of(built, family, tmp_path)
    needles = fault(folder)
    assert_load_refused(folder, needles)


# --- a chat template is code: one that never ends, or fails, is refused in bounded time -----------------
ENDLESS_TEMPLATE = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("template,needle", [
    (ENDLESS_TEMPLATE, "runs for more than 5 s on one prompt"),
    ("{% for i in range(10**9) %}x{% endfor %}", "fails on a prompt (OverflowError: Range too big"),
], ids=["endless", "failing"])
def test_a_crafted_chat_template_is_refused_before_the_weights(built, tmp_path, no_weights, template, needle):
    folder = copy_of(built, "janus", tmp_path)
    (folder / "chat_template.jinja").write_text(template)
    started = time.monotonic()
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(folder, dtype="fp32", device="cpu")
    assert time.monotonic() - started < 120  # unbounded, the endless one runs for hours
    assert needle in str(err.value) and "download chat_template.jinja" in str(err.value)
    one_sentence(str(err.value))


def test_prompt_encoding_is_bounded_by_the_same_rule(family_models):
    """A template swapped in after loading is bounded at each prompt, and the good one still gives
    the prompt it always gave (the control)."""
    model = family_models["janus"]
    before = model.encode_prompt("a red cat").prompt_ids
    original = model.processor.chat_template
    model.processor.chat_template = ENDLESS_TEMPLATE
    try:
        with pytest.raises(sp.ModelLoadError, match="runs for more than 5 s on one prompt"):
            model.encode_prompt("a red cat")
    finally:
        model.processor.chat_template = original
    assert torch.equal(model.encode_prompt("a red cat").prompt_ids, before)


@pytest.mark.parametrize("name", ["vocab.json", "vq_config.json", "generation_config.json"])
def test_demo_json_nested_past_reading_names_the_rebuild(tmp_path, name):
    copy = Path(shutil.copytree(loader.DEMO_FOLDER, tmp_path / "demo"))
    _nested(name)(copy)
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy, device="cpu")
    message = str(err.value)
    assert f"{name} nests its JSON too deeply to be read" in message
    assert message.endswith("rebuild the bundled demo model with `python -m sjd_pac_core.demo.tools.train`.")
    one_sentence(message)


def test_a_missing_weight_file_is_named_not_blamed_on_config_json(tmp_path):
    """The layer count is compared with the weight files only when they are all there: a missing
    model.safetensors is named as such (the VQ's own file beside it holds far fewer parameters)."""
    copy = Path(shutil.copytree(loader.DEMO_FOLDER, tmp_path / "demo"))
    (copy / "model.safetensors").unlink()
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy, device="cpu")
    assert "model.safetensors" in str(err.value) and "config.json" not in str(err.value)
    one_sentence(str(err.value))


def test_demo_config_values_name_the_rebuild(tmp_path):
    copy = Path(shutil.copytree(loader.DEMO_FOLDER, tmp_path / "demo"))
    config = json.loads((copy / "config.json").read_text())
    config["num_attention_heads"] = 0
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(copy, device="cpu")
    assert "sets num_attention_heads to 0" in str(err.value) and "python -m sjd_pac_core.demo.tools.train" in str(err.value)
    one_sentence(str(err.value))


# --- 5. devices ----------------------------------------------------------------------------------
DEVICE_REFUSED = [
    ("tpu", "'tpu' is not a device name; choose one of 'auto', 'cpu'"),
    ("CPU", "'CPU' is not a device name"),
    ("meta", "The device 'meta' holds no data, so a model cannot run on it; choose one of"),
    (torch.device("meta"), "The device 'meta' holds no data"),
    ("xpu", "The device 'xpu' is not supported; choose one of"),
    (-1, "device=-1 is not a CUDA index"),
    (1.5, "device must be a device name or a CUDA index, got 1.5 of type float"),
    (True, "got True of type bool"),
    (None, "got None of type NoneType"),
    (["cpu"], "got ['cpu'] of type list"),
]


@pytest.mark.parametrize("device,needle", DEVICE_REFUSED, ids=[repr(d) for d, _ in DEVICE_REFUSED])
def test_devices_that_cannot_run_a_model_are_one_sentence(device, needle, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loader, "_mps_available", lambda: False, raising=False)
    for call in (lambda: sp.load_model("demo", device=device), lambda: sp.resolve_device(device)):
        with pytest.raises(sp.ModelLoadError) as err:
            call()
        assert type(err.value) is sp.ModelLoadError and needle in str(err.value), str(err.value)
        one_sentence(str(err.value))


def test_an_integer_device_is_that_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(sp.ModelLoadError, match="CUDA was asked for but this PyTorch has no CUDA device"):
        sp.resolve_device(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert sp.resolve_device(0) == torch.device("cuda:0") and sp.resolve_device(1) == torch.device("cuda", 1)
    assert sp.resolve_device("cuda:1") == torch.device("cuda:1") and sp.resolve_device("1") == torch.device("cuda:1")
    with pytest.raises(sp.ModelLoadError) as err:
        sp.resolve_device(2)
    assert "There is no CUDA device 2 here; choose one of 'auto', 'cpu', 'cuda', 'cuda:0', 'cuda:1'" in str(err.value)
    one_sentence(str(err.value))


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu"), "auto"])
def test_devices_that_run_give_the_same_model(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loader, "_mps_available", lambda: False, raising=False)
    assert sp.resolve_device(device) == torch.device("cpu")


# --- 6. prompts that are not text ------------------------------------------------------------------
@pytest.fixture
def forward_calls(demo_model) -> List[int]:
    calls: List[int] = []
    handle = demo_model.token_model.model.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(1), with_kwargs=True)
    yield calls
    handle.remove()


PROMPT_REFUSED = [
    ("prompt None", dict(prompt=None), "prompt must be text (a str), got None of type NoneType"),
    ("prompt int", dict(prompt=123), "prompt must be text (a str), got 123 of type int"),
    ("prompt bytes", dict(prompt=b"a red circle"), "got b'a red circle' of type bytes"),
    ("prompt list", dict(prompt=["a", "red"]), "got ['a', 'red'] of type list"),
    ("negative prompt int", dict(negative_prompt=5), "negative_prompt must be text (a str), got 5 of type int"),
    ("model a path", dict(model="demo"), "model must be a model from sjd_pac_core.load_model, got str"),
]


@pytest.mark.parametrize("overrides,needle", [r[1:] for r in PROMPT_REFUSED], ids=[r[0] for r in PROMPT_REFUSED])
def test_prompts_that_are_not_text_are_refused_before_any_pass(demo_model, forward_calls, overrides, needle):
    args = dict(model=demo_model, prompt="a red circle on a blue background", seed=0)
    args.update(overrides)
    with pytest.raises(sp.ConfigError) as err:
        sp.generate_image(**args)
    assert type(err.value) is sp.ConfigError and needle in str(err.value), str(err.value)
    one_sentence(str(err.value))
    assert forward_calls == []


def test_a_negative_prompt_of_none_is_no_negative_prompt(demo_model):
    prompt = "a red circle on a blue background"
    assert torch.equal(sp.generate_image(demo_model, prompt, seed=2, negative_prompt=None).tokens,
                       sp.generate_image(demo_model, prompt, seed=2, negative_prompt="").tokens)


def test_the_sampler_node_gives_the_same_sentence():
    from test_nodes import load_pack, sampler_args

    pack = load_pack()
    (handle,) = pack.NODE_CLASS_MAPPINGS["LoadARImageModel"]().load("demo", "auto", "cpu")
    with pytest.raises(sp.ConfigError, match="prompt must be text") as err:
        pack.NODE_CLASS_MAPPINGS["SJDPACSampler"]().sample(handle, **sampler_args(prompt=None))
    one_sentence(str(err.value))


# --- 7. decoding tokens that are not this model's image -------------------------------------------
@pytest.fixture(scope="module")
def family_models(built, demo_model):
    models = {family: sp.load_model(folder, dtype="fp32", device="cpu") for family, folder in built.items()}
    return {"demo": demo_model, **models}


RESOLUTION = {"demo": "64x64", "lumina_mgpt": "96x96", "emu3": "48x48", "janus": "96x96"}


def _prompt(family: str) -> str:
    return "a red circle on a blue background" if family == "demo" else "a red cat"


def _valid_tokens(model, family) -> torch.Tensor:
    enc = model.encode_prompt(_prompt(family), resolution=RESOLUTION[family])
    forced = enc.layout.forced_tokens()
    first_code = int(enc.constraints.allowed.nonzero()[0, 0]) if enc.constraints.allowed.dim() == 1 \
        else int(enc.constraints.allowed[0].nonzero()[0, 0])
    return torch.where(forced >= 0, forced, torch.full_like(forced, first_code))


def _decode_faults(model, family):
    tokens = _valid_tokens(model, family)
    vocab = model.token_model.vocab_size
    layout = model.encode_prompt(_prompt(family), resolution=RESOLUTION[family]).layout
    forced = layout.forced_tokens()
    code_at = int((forced < 0).nonzero()[0, 0])
    not_a_code = int(forced.max()) if forced.max() >= 0 else None
    rows = [
        ("too few tokens", tokens[:10], "tokens per image"),
        ("one token too many", torch.cat([tokens, tokens[:1]]), "tokens per image"),
        ("an id past the token space", tokens.clone().index_fill_(0, torch.tensor([code_at]), vocab + 5),
         f"decode got the id {vocab + 5}, outside the {vocab:,} ids"),
        ("a negative id", tokens.clone().index_fill_(0, torch.tensor([code_at]), -3), "decode got the id -3"),
        ("float tokens", tokens.float(), "decode needs integer token ids, got a torch.float32 tensor"),
        ("a 3-D batch", tokens.reshape(1, 1, -1), "decode needs one image's tokens [num_tokens] or a batch"),
        ("a string", "1 2 3", "decode needs image tokens (a LongTensor of ids), got a str"),
    ]
    if not_a_code is not None:  # a row-end id where a code belongs
        rows.append(("a forced id where a code belongs", tokens.clone().index_fill_(0, torch.tensor([code_at]), not_a_code),
                     f"decode got the id {not_a_code} where an image code belongs"))
    return rows


@pytest.mark.parametrize("family", ["demo", "lumina_mgpt", "emu3", "janus"])
def test_decoding_tokens_that_are_not_this_models_image_is_one_sentence(family_models, family):
    model = family_models[family]
    for name, tokens, needle in _decode_faults(model, family):
        for resolution in (RESOLUTION[family], None):
            with pytest.raises(sp.ConfigError) as err:
                model.decode(tokens, resolution)
            message = str(err.value)
            assert type(err.value) is sp.ConfigError and (needle in message or "no " + model.family in message), \
                (name, message)
            one_sentence(message)


@pytest.mark.parametrize("family", ["demo", "lumina_mgpt", "emu3", "janus"])
def test_valid_tokens_decode_the_same_from_a_list_or_a_batch(family_models, family):
    model = family_models[family]
    tokens = _valid_tokens(model, family)
    one = np.asarray(model.decode(tokens, RESOLUTION[family])[0])
    assert np.array_equal(np.asarray(model.decode(tokens.tolist(), RESOLUTION[family])[0]), one)
    assert np.array_equal(np.asarray(model.decode(tokens.int().unsqueeze(0), RESOLUTION[family])[0]), one)
    batch = model.decode(torch.stack([tokens, tokens]), RESOLUTION[family])  # (batched convolutions may round apart)
    assert len(batch) == 2 and np.array_equal(np.asarray(batch[0]), np.asarray(batch[1]))


def test_a_transformers_too_old_is_one_sentence_before_any_file_is_read(tmp_path, monkeypatch):
    """transformers 5.17 lacks the static cache's rollback and shapes a tree pass's masks otherwise
    (seen on a GPU machine): load_model says so and how to upgrade, before touching the folder."""
    import transformers

    from sjd_pac_core.models.checks import MIN_TRANSFORMERS, check_transformers_version

    check_transformers_version()  # the installed one passes
    check_transformers_version(MIN_TRANSFORMERS)
    monkeypatch.setattr(transformers, "__version__", "5.17.0")
    read = []
    monkeypatch.setattr(loader, "model_family", lambda *args: read.append(args))
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(tmp_path / "no-such-folder")
    message = str(err.value)
    assert message.startswith("transformers 5.17.0 is installed but sjd-pac needs") and message.count(";") == 1
    assert f'pip install -U "transformers>={MIN_TRANSFORMERS}"' in message and not read
