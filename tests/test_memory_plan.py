"""The memory plan's arithmetic and the table docs/models.md shows, computed from the published
configs' shapes (no weights, no download: the models are built on the meta device)."""

from __future__ import annotations

from pathlib import Path

import torch

from sjd_pac_core.models import memory
from sjd_pac_core.models.published import PUBLISHED, family_class, published_plans, published_table

DOCS = Path(__file__).resolve().parent.parent / "docs" / "models.md"


def test_docs_hold_the_table_this_code_computes():
    assert published_table() in DOCS.read_text()


def meta_params(family: str, names) -> int:
    """Parameters of these submodules of the published config's transformers model (meta device)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration, JanusConfig, JanusForConditionalGeneration

    classes = {"emu3": (Emu3Config, Emu3ForConditionalGeneration),
               "janus": (JanusConfig, JanusForConditionalGeneration)}
    config_class, model_class = classes[family]
    with torch.device("meta"):
        model = model_class(config_class.from_dict(dict(PUBLISHED[family][1], vocabulary_map={})))
    return sum(p.numel() for name in names for p in model.get_submodule(name).parameters())


def test_published_shapes_give_the_known_sizes():
    plans = {name: plan for name, _, _, plan in published_plans()}
    # Emu3-Gen: a 184,622-row embedding and head, both cut to 32,768 codes + 4 forced tokens on the
    # device; the embedding's whole table in CPU memory; the head's unused rows and the VQ encoder
    # are read, then dropped.
    shape = family_class("emu3").memory_shape(PUBLISHED["emu3"][1], Path("Emu3-Gen-hf"))
    assert shape.sampler_vocab == 32772 and shape.image_tokens["720x720"] == 8193
    vq_encoder = meta_params("emu3", ["model.vqmodel.encoder", "model.vqmodel.quant_conv"])
    assert vq_encoder > 100e6  # about 0.2 GB in bf16
    assert shape.weights.dropped == (184622 - 32772) * 4096 + vq_encoder
    assert shape.weights.host == 184622 * 4096
    # KV cache: layers x 2 x rows x kv heads x entries x head dim x bytes (bf16).
    plan = plans["Emu3-Gen-hf"]
    assert plan.cost("none").kv_cache == 32 * 2 * 2 * 8 * plan.cache_entries * 128 * 2
    assert plan.cache_entries == memory.PROMPT_TOKENS + 8193 + 128 + 1  # the auto window's probe (128) is the largest pass
    # Janus-Pro: no row of the text head or the text embedding is on the device (JanusConfig ties
    # the two by default: one table, in CPU memory); the understanding encoder, its aligner and the
    # VQ encoder are dropped; 576 image tokens.
    janus = family_class("janus").memory_shape(PUBLISHED["janus"][1], Path("Janus-Pro-7B"))
    assert janus.sampler_vocab == 16384 and janus.image_tokens == {"384x384": 576}
    assert janus.weights.host == 102400 * 4096
    unused = meta_params("janus", ["model.vision_model", "model.aligner", "model.vqmodel.encoder",
                                   "model.vqmodel.quant_conv"])
    assert unused > 300e6 and janus.weights.dropped == unused  # about 0.7 GB in bf16
    # Every precision is smaller than the one before it, and 4-bit weights are under a third of bf16's.
    for name, plan in plans.items():
        totals = [c.total for c in plan.costs]
        assert totals == sorted(totals, reverse=True), name
        assert plan.cost("4bit").weights < plan.cost("none").weights / 3 + 2.0e9, name


def test_fits_and_the_sentence_naming_what_fits():
    plan = published_plans()[1][3]  # Lumina-mGPT-7B-768
    plan = memory.MemoryPlan(**{**plan.__dict__, "free": int(8.0e9), "device": "cuda:0"})
    assert not plan.fits("none") and not plan.fits("int8") and plan.fits("4bit")
    assert plan.most_precise_fitting(("none", "int8", "4bit")) == "4bit"
    message = plan.not_enough("none", ("none", "int8", "4bit"))
    assert message.startswith(
        "The model needs 16.2 GB in bf16, 8.0 GB free on cuda:0; quantize='4bit' needs 6.9 GB")
    assert message.endswith(".") and "\n" not in message
    assert "0.5 GB of CPU memory" in plan.one_line("4bit")  # the embedding table, beside the GPU


def test_published_checkpoints_fit_8_gb_at_4_bit_and_12_gb_at_8_bit():
    """The targets, by the plan: every family at its default resolution in 8 GB at 4 bit (with
    guidance), and every row of the table in 12 GB at 8 bit - except Lumina-mGPT 2.0, whose
    9,313-token image needs a 10 GB KV cache with guidance (test_lumina_mgpt2: 24 and 16 GB)."""
    defaults = {"Lumina-mGPT-7B-768", "Emu3-Gen-hf", "Janus-Pro-7B"}
    for name, _, _, plan in published_plans():
        if plan.family == "lumina_mgpt2":
            continue
        assert plan.cost("int8").total <= 12e9, name
        if name in defaults:
            assert plan.cost("4bit").total <= 8e9, name


def test_the_embedding_table_counts_where_it_lives():
    """On a GPU the table is CPU memory beside the device and passes through the device only while
    a quantized model loads there; on the CPU device it is part of the weights."""
    shape = family_class("emu3").memory_shape(PUBLISHED["emu3"][1], Path("Emu3-Gen-hf"))
    table = 184622 * 4096 * 2
    gpu = memory.plan_memory(shape, torch.device("cuda"), torch.bfloat16, free=None)
    cpu = memory.plan_memory(shape, torch.device("cpu"), torch.bfloat16, free=None)
    assert gpu.cost("none").host == gpu.cost("4bit").host == table and cpu.cost("none").host == 0
    assert cpu.cost("none").weights == gpu.cost("none").weights + table
    # An unquantized GPU load is prepared in CPU memory: nothing passes through the GPU.
    assert gpu.cost("none").loading_extra == 0
    assert gpu.cost("4bit").loading_extra == shape.weights.dropped * 2 + table
    assert cpu.cost("int8").loading_extra == shape.weights.dropped * 2


def test_free_memory_reads_the_cpu():
    free = memory.free_memory(torch.device("cpu"))
    assert free is None or free > 0


# --- refused from config.json alone, and what a plan is asked for ---------------------------------------

import json  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402

import sjd_pac_core as sp  # noqa: E402
from sjd_pac_core.models import loader  # noqa: E402
from tiny_checkpoints import build_emu3  # noqa: E402


def one_sentence(message: str) -> None:
    assert message.count(". ") == 0 and message.endswith(".") and "\n" not in message, message


@pytest.fixture(scope="module")
def emu3_folder(tmp_path_factory) -> Path:
    return build_emu3(tmp_path_factory.mktemp("plan") / "emu3")


@pytest.fixture(scope="module")
def narrow_emu3(tmp_path_factory) -> Path:
    """Decoder layers 40 and 72 wide: no 4-bit group size (32 at least) divides them."""
    return build_emu3(tmp_path_factory.mktemp("plan") / "emu3-narrow", width=40, inner=72)


def _with_config(folder: Path, tmp_path: Path, change) -> Path:
    copy = Path(shutil.copytree(folder, tmp_path / folder.name))
    config = json.loads((copy / "config.json").read_text())
    change(config)
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize("layers,needle", [
    (100000, "sets text_config.num_hidden_layers to 100,000, far more than any checkpoint has (at most 512)"),
    (300, "describes decoder layers of at least"),  # possible in principle, but not with these weights
])
def test_absurd_layer_counts_are_refused_before_anything_is_built(emu3_folder, tmp_path, monkeypatch, no_weights,
                                                                  layers, needle):
    """num_hidden_layers 100000 built 100,000 layers on the meta device before any check (minutes,
    gigabytes): refused from the numbers in config.json and the weight files' headers."""
    from sjd_pac_core.models import emu3

    copy = _with_config(emu3_folder, tmp_path, lambda c: c["text_config"].__setitem__("num_hidden_layers", layers))
    monkeypatch.setattr(emu3, "meta_model", lambda *args: pytest.fail("a model was built"))
    for call in (lambda: sp.memory_plan(copy, device="cpu"), lambda: sp.load_model(copy, device="cpu")):
        with pytest.raises(sp.ModelLoadError) as err:
            call()
        assert needle in str(err.value) and str(copy / "config.json") in str(err.value)
        one_sentence(str(err.value))


def test_a_checkpoint_no_4bit_group_divides_loads_unquantized(narrow_emu3):
    plan = sp.memory_plan(narrow_emu3, device="cpu")
    assert [c.precision for c in plan.costs] == ["none", "int8"]  # 4-bit is not offered for it
    model = sp.load_model(narrow_emu3, device="cpu", dtype="fp32")
    assert model.family == "emu3" and model.quantize == "none"
    assert sp.load_model(narrow_emu3, device="cpu", dtype="fp32", quantize="auto").quantize == "none"


def test_4bit_asked_of_such_a_checkpoint_names_what_was_asked(narrow_emu3, no_weights):
    pytest.importorskip("torchao")
    with pytest.raises(sp.ModelLoadError) as err:
        sp.load_model(narrow_emu3, device="cpu", quantize="4bit")
    message = str(err.value)
    assert message.startswith("quantize='4bit' (torchao int4") and "(40, 72)" in message
    assert message.endswith("use quantize='int8' or 'none' for it.")
    one_sentence(message)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(resolution="999x999"), "draws no 999x999 image; choose one of 48x48"),
    (dict(resolution=512), "resolution must be a size such as '768x768' or None"),
    (dict(rows="2"), "rows must be 1 (no guidance) or 2 (guidance"),
    (dict(rows=2.0), "rows must be 1"),
    (dict(rows=0), "rows must be 1"),
], ids=["unknown size", "size not text", "rows text", "rows float", "rows zero"])
def test_memory_plan_arguments_are_one_sentence(emu3_folder, kwargs, needle):
    with pytest.raises(sp.ModelLoadError) as err:
        sp.memory_plan(emu3_folder, device="cpu", **kwargs)
    assert needle in str(err.value)
    one_sentence(str(err.value))
    assert sp.memory_plan(emu3_folder, device="cpu", rows=1, resolution="48x48").rows == 1  # the control


def test_memory_plan_of_the_demo_is_none():
    assert sp.memory_plan(loader.DEMO_NAME, device="cpu") is None
