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


def test_published_shapes_give_the_known_sizes():
    plans = {name: plan for name, _, _, plan in published_plans()}
    # Emu3-Gen: 184,622-row embedding and a head cut to 32,768 codes + 4 forced tokens; about 8.5B
    # parameters in the file, of which the text head's unused rows (about 0.6B) are dropped.
    shape = family_class("emu3").memory_shape(PUBLISHED["emu3"][1], Path("Emu3-Gen-hf"))
    assert shape.sampler_vocab == 32772 and shape.image_tokens["720x720"] == 8193
    assert shape.weights.dropped == (184622 - 32772) * 4096
    # KV cache: layers x 2 x rows x kv heads x entries x head dim x bytes (bf16).
    plan = plans["Emu3-Gen-hf"]
    assert plan.cost("none").kv_cache == 32 * 2 * 2 * 8 * plan.cache_entries * 128 * 2
    assert plan.cache_entries == memory.PROMPT_TOKENS + 8193 + 128 + 1  # the auto window's probe (128) is the largest pass
    # Janus-Pro: no row of the text head is kept; 576 image tokens.
    janus = family_class("janus").memory_shape(PUBLISHED["janus"][1], Path("Janus-Pro-7B"))
    assert janus.sampler_vocab == 16384 and janus.image_tokens == {"384x384": 576}
    assert janus.weights.dropped == 102400 * 4096
    # Every precision is smaller than the one before it, and 4-bit weights are under a third of bf16's.
    for name, plan in plans.items():
        totals = [c.total for c in plan.costs]
        assert totals == sorted(totals, reverse=True), name
        assert plan.cost("4bit").weights < plan.cost("none").weights / 3 + 2.0e9, name


def test_fits_and_the_sentence_naming_what_fits():
    plan = published_plans()[1][3]  # Lumina-mGPT-7B-768
    plan = memory.MemoryPlan(**{**plan.__dict__, "free": int(9.8e9), "device": "cuda:0"})
    assert not plan.fits("none") and not plan.fits("int8") and plan.fits("4bit")
    assert plan.most_precise_fitting(("none", "int8", "4bit")) == "4bit"
    message = plan.not_enough("none", ("none", "int8", "4bit"))
    assert message.startswith("The model needs 16.7 GB in bf16, 9.8 GB free on cuda:0; quantize='4bit' needs 7.4 GB")
    assert message.endswith(".") and "\n" not in message


def test_free_memory_reads_the_cpu():
    free = memory.free_memory(torch.device("cpu"))
    assert free is None or free > 0
