"""Weight-only quantization, the memory plan and offload, on tiny checkpoints of the real classes.

For every scheme offered on the CPU (torchao int8 weight-only, torchao int4 weight-only) and every
family:
  * a window pass gives the same logits as token-by-token passes, within fp32 rounding: a
    position's output does not depend on the other rows of the pass;
  * with verify="gumbel", AR, SJD and SJD-PAC return the same tokens (seed-exactness);
  * exactly the decoder layers' linear maps are quantized (per family, by name);
  * the plan's weight bytes are what the loaded model holds.
A planted batch-dependent scheme (torchao int8 dynamic activations with one scale per pass)
must fail both tests. bitsandbytes NF4 (CUDA) is checked here for what it quantizes; its
numbers come from benchmarks/gpu_bench.py on a GPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Dict

import pytest
import torch

import sjd_pac_core as sp
from sjd_pac_core.models import janus as janus_mod
from sjd_pac_core.models import memory
from sjd_pac_core.models import quantize as qz
from sjd_pac_core.models.kept_parts import HeadRows
from sjd_pac_core.models.loader import read_config
from exactness_tools import gumbel_cfg_tokens as run
from tiny_checkpoints import BUILDERS

pytestmark = [
    pytest.mark.usefixtures("tiny_lumina_sizes"),
    pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="the quant extra is not installed"),
]

FAMILIES = ["lumina_mgpt", "emu3", "janus", "lumina_mgpt2"]
OFFERED_ON_CPU = ["int8", "4bit"]
PROMPT = "a red cat on the blue field"
WINDOW_TOLERANCE = 1e-4  # fp32: measured <= 8e-6 for every offered scheme; the control 4e-3 .. 1e-1
LAYER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
LAYERS_PREFIX = {"lumina_mgpt": "model.layers", "emu3": "model.text_model.layers",
                 "janus": "model.language_model.layers", "lumina_mgpt2": "model.layers"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_quant")
    return {family: BUILDERS[family](root / family) for family in FAMILIES}


@pytest.fixture(scope="module")
def models(folders):
    return {(family, q): sp.load_model(folders[family], dtype="fp32", device="cpu", quantize=q)
            for family in FAMILIES for q in ["none"] + OFFERED_ON_CPU}


def window_gap(model, n: int = 8) -> float:
    """Max |logit difference| between one window pass over n tokens and n one-token passes (CFG rows)."""
    tm = model.token_model
    enc = model.encode_prompt(PROMPT)
    prompts = [enc.prompt_ids, enc.uncond_ids]
    tokens = torch.randint(0, model.num_codes, (n,), generator=torch.Generator().manual_seed(0))
    window = tm.open_session(prompts)
    window.prefill()
    together = window.forward(tokens, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
    window.close()
    steps = tm.open_session(prompts)
    steps.prefill()
    one = []
    for i in range(n):
        one.append(steps.forward(tokens[i:i + 1], torch.zeros(1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool)))
        steps.keep([0])
    steps.close()
    return float((together - torch.cat(one, 1)).abs().max())


def runs_that_differ(model, seeds) -> int:
    """How many SJD / SJD-PAC runs give other tokens than AR with the same seed."""
    differ = 0
    for seed in seeds:
        ar = run(model, "ar", seed)
        for method, kw in (("sjd", dict(window=8)), ("sjd_pac", dict(window=16, tree_width=3))):
            differ += int(not torch.equal(run(model, method, seed, **kw), ar))
    return differ


# --- exactness of every offered scheme -------------------------------------------------------------
@pytest.mark.parametrize("precision", OFFERED_ON_CPU)
@pytest.mark.parametrize("family", FAMILIES)
def test_window_pass_equals_token_by_token(models, family, precision):
    model = models[(family, precision)]
    assert model.quantize == precision and qz.quantized_modules(model.model)
    assert window_gap(model) < WINDOW_TOLERANCE


@pytest.mark.parametrize("precision", OFFERED_ON_CPU)
@pytest.mark.parametrize("family", FAMILIES)
def test_ar_sjd_and_sjd_pac_give_identical_tokens(models, family, precision):
    assert runs_that_differ(models[(family, precision)], seeds=(0, 1, 2)) == 0


def _batch_dependent(scheme, dtype, skip, group):
    """The planted control: int8 activations with one scale for the whole pass."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig
    from torchao.quantization.granularity import PerTensor
    from transformers import TorchAoConfig

    return TorchAoConfig(Int8DynamicActivationInt8WeightConfig(granularity=PerTensor()), modules_to_not_convert=skip)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_batch_dependent_scheme_fails_the_same_tests(folders, family, monkeypatch):
    control = dataclasses.replace(qz.TORCHAO_INT8, label="int8 dynamic activations (per pass)", build=_batch_dependent)
    monkeypatch.setitem(qz.SCHEMES, ("cpu", "int8"), control)
    model = sp.load_model(folders[family], dtype="fp32", device="cpu", quantize="int8")
    assert qz.quantized_modules(model.model)
    assert window_gap(model) > 10 * WINDOW_TOLERANCE
    # Seed-exactness breaks too: some speculative run commits other tokens than AR.
    assert runs_that_differ(model, seeds=range(6)) > 0


# --- what is quantized, what it weighs -----------------------------------------------------------
def expected_quantized(family: str) -> set:
    return {f"{LAYERS_PREFIX[family]}.{layer}.{name}" for layer in range(2) for name in LAYER_LINEARS}


@pytest.mark.parametrize("precision", OFFERED_ON_CPU)
@pytest.mark.parametrize("family", FAMILIES)
def test_only_the_decoder_layers_are_quantized(models, family, precision):
    model = models[(family, precision)]
    assert set(qz.quantized_modules(model.model)) == expected_quantized(family)
    # The LM head keeps the rows sampling uses (none of Janus-Pro's text head), in full precision.
    head = model.model.lm_head
    assert isinstance(head, HeadRows) and not qz.is_quantized(head.rows)
    rows = {"janus": 0, "emu3": model.num_codes + 4, "lumina_mgpt": model.num_codes + 2,
            "lumina_mgpt2": model.num_codes + 2}[family]
    assert head.rows.shape[0] == rows


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_nf4_quantizes_the_same_modules(folders, family, monkeypatch):
    """bitsandbytes NF4 (the CUDA 4-bit scheme) gets the same include filter; here loaded on the
    CPU to list what it converted (its CPU kernels are not what it is offered for)."""
    monkeypatch.setitem(qz.SCHEMES, ("cpu", "4bit"), qz.BNB_NF4)
    model = sp.load_model(folders[family], dtype="fp32", device="cpu", quantize="4bit")
    assert set(qz.quantized_modules(model.model)) == expected_quantized(family)


@pytest.mark.parametrize("precision", ["none"] + OFFERED_ON_CPU)
@pytest.mark.parametrize("family", FAMILIES)
def test_plan_weights_are_what_the_model_holds(models, family, precision):
    model = models[(family, precision)]
    decoder = {"lumina_mgpt": "vqgan", "lumina_mgpt2": "movq"}.get(family)  # kept beside the transformers model
    held = qz.weight_bytes([model.model] + ([getattr(model, decoder)] if decoder else []))
    planned = model.memory_plan.cost(precision).weights
    assert abs(held - planned) <= 0.002 * planned, (held, planned)  # buffers (rotary tables) aside


def test_auto_picks_the_most_precise_that_fits(folders, monkeypatch):
    folder = folders["emu3"]
    plan = sp.memory_plan(folder, dtype="fp32", device="cpu")
    needs = {c.precision: c.total for c in plan.costs}
    assert needs["none"] > needs["int8"]
    monkeypatch.setattr(memory, "free_memory", lambda device: (needs["none"] + needs["int8"]) // 2)
    model = sp.load_model(folder, dtype="fp32", device="cpu", quantize="auto")
    assert model.quantize == "int8"
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(folder, dtype="fp32", device="cpu", quantize="none")
    message = str(err.value)
    assert "needs" in message and "GB in fp32" in message and "quantize='int8' needs" in message
    assert "\n" not in message and message.endswith(".")


def test_plan_renders_one_line_and_a_table(folders):
    plan = sp.memory_plan(folders["janus"], dtype="bf16", device="cpu")
    assert isinstance(plan, memory.MemoryPlan)
    assert "janus 96x96: needs" in plan.one_line("none") and "\n" not in plan.one_line("4bit")
    table = plan.table()
    assert "| bf16 |" in table and "| quantize='int8' |" in table and "| quantize='4bit' |" in table
    # KV cache: layers x 2 x rows x kv_heads x capacity x head_dim x bytes.
    shape = janus_mod.JanusImageModel.memory_shape(read_config(folders["janus"]))
    assert plan.cost("none").kv_cache == 2 * 2 * 2 * shape.kv_heads * plan.cache_entries * shape.head_dim * 2


# --- offload ---------------------------------------------------------------------------------------
def split_map(model: torch.nn.Module, layers_prefix: str) -> dict:
    """A device map over the top modules: the decoder layers alternate between the CPU and disk."""
    placement = {}
    for name, _ in model.named_modules():
        if name.startswith(layers_prefix + ".") and name.count(".") == layers_prefix.count(".") + 1:
            placement[name] = "disk" if int(name.rsplit(".", 1)[1]) % 2 else "cpu"
    covered = lambda n: any(n == k or n.startswith(k + ".") for k in placement)  # noqa: E731
    for name, param in model.named_parameters():
        if not covered(name):
            parts = name.split(".")
            placement[".".join(parts[:-1]) if len(parts) > 1 else name] = "cpu"
    return placement


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="the offload extra is not installed")
@pytest.mark.parametrize("family", FAMILIES)
def test_offloaded_model_gives_the_same_tokens(folders, models, family, tmp_path):
    whole = models[(family, "none")]
    device_map = split_map(whole.model, LAYERS_PREFIX[family])
    assert "disk" in device_map.values()
    spread = sp.load_model(folders[family], dtype="fp32", device="cpu", device_map=device_map,
                           offload_folder=tmp_path / "offload")
    assert set(spread.model.hf_device_map.values()) == {"cpu", "disk"}
    # The map places only what sampling keeps: the modules the family drops load on the CPU, then go.
    dropped = tuple(getattr(type(spread), "UNUSED_MODULES", ()))
    assert not [key for key in spread.model.hf_device_map if dropped and key.startswith(dropped)]
    assert spread.token_model.cache_layers is None  # one cache storage per layer: the split path
    for seed in (0, 1):
        assert torch.equal(run(spread, "sjd_pac", seed, window=16, tree_width=3), run(whole, "sjd_pac", seed, window=16,
                                                                                      tree_width=3))
    assert torch.equal(run(spread, "ar", 0), run(whole, "ar", 0))


def test_missing_accelerate_names_the_extra(folders, monkeypatch, no_weights):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(sp.ModelLoadError, match=r"needs accelerate.*sjd-pac\[offload\]") as err:
        sp.load_model(folders["janus"], device="cpu", device_map="auto")
    assert "download" not in str(err.value)


# --- bad input: one sentence, before any weight is read ------------------------------------------
# (the no_weights fixture is in conftest.py)
def _no_torchao(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))


BAD_INPUT = [
    # (quantize, device, setup, message pattern)
    ("8bit", "cpu", None, r"Unknown quantize value '8bit'; choose one of none, int8, 4bit, auto"),
    (4, "cpu", None, r"Unknown quantize value 4; choose one of"),
    ("llm_int8", "cpu", None, r"not offered: .*depend on the other rows of the pass"),
    ("int8_dynamic", "cpu", None, r"not offered: .*depend on the other rows"),
    ("int8", "cpu", _no_torchao, r"uses torchao, which is not installed; install it with `pip install \"sjd-pac\[quant\]\"`"),
    ("4bit", "cpu", _no_torchao, r"uses torchao, which is not installed"),
]


@pytest.mark.parametrize("quantize, device, setup, pattern", BAD_INPUT)
def test_bad_quantize_input(folders, no_weights, monkeypatch, quantize, device, setup, pattern):
    if setup is not None:
        setup(monkeypatch)
    with pytest.raises(sp.ModelLoadError, match=pattern) as err:
        sp.load_model(folders["emu3"], device=device, quantize=quantize)
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


@pytest.mark.parametrize("precision", ["int8", "4bit"])
def test_a_device_without_a_scheme_says_what_works(precision):
    with pytest.raises(sp.ModelLoadError, match=rf"quantize='{precision}' cannot run on mps: .*device='cpu'") as err:
        qz.scheme_for(precision, torch.device("mps"))
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


def test_demo_model_is_not_quantized():
    """Refused in words of ours: quantization is for the real families (never a library's "device_map")."""
    with pytest.raises(sp.ModelLoadError, match="quantize='int8' is for the real families") as err:
        sp.load_model("demo", device="cpu", quantize="int8")
    assert "device_map" not in str(err.value) and str(err.value).endswith("so use quantize='none'.")
    with pytest.raises(sp.ModelLoadError, match="leave device_map unset"):
        sp.load_model("demo", device="cpu", device_map="auto")


# --- the benchmark command -------------------------------------------------------------------------
def test_quant_bench_runs_tiny(tmp_path):
    """The command the CPU numbers come from, on a tiny shape: its counts, not its times."""
    import json

    from sjd_pac_core.bench.quantized import main as quant_main

    assert quant_main(["--tiny", "--out", str(tmp_path)]) == 0
    rows = {r["precision"]: r for r in json.loads((tmp_path / "quant_bench.json").read_text())["rows"]}
    assert set(rows) == {"none", "int8", "4bit"}
    assert rows["none"]["quantized_linears"] == 0 and rows["int8"]["quantized_linears"] == 2 * 7
    assert rows["int8"]["weight_bytes"] < rows["none"]["weight_bytes"]
    assert all(r["sjd_pac_equals_ar"] and r["step_compression"] >= 1.0 for r in rows.values())
