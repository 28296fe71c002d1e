"""Only what sampling can use on the device (models/kept_parts.py), on tiny checkpoints of the real classes.

* The input embedding is split: its token-space rows on the model's device (a parameter, moved
  with the model), its whole table in CPU memory (a buffer that `.to()` leaves in place), both
  exact copies of the checkpoint's rows; the adapters embed the prompt from the table and sampled
  tokens from the rows. Here the device is the CPU, so where things live is tested by ownership
  and by moving a copy to the meta device.
* Tokens with the split equal tokens with the embedding kept whole on the device (the loading
  before it), with the gumbel rule, AR and SJD-PAC, guidance on, in fp32 and int8; a planted fault
  in the rows or in the table changes them.
* Parts that image generation never runs are gone, the parts it runs are there, and the plan
  counts the rows on the device and the table beside it, to the byte.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Dict

import pytest
import torch
from safetensors import safe_open

import sjd_pac_core as sp
from sjd_pac_core.models import causal_lm, kept_parts
from sjd_pac_core.models import quantize as qz
from sjd_pac_core.models.kept_parts import EmbeddingRows
from sjd_pac_core.models.loader import FAMILIES as FAMILY_CLASSES
from sjd_pac_core.models.loader import _family_class, read_config
from sjd_pac_core.models.memory import plan_memory
from exactness_tools import gumbel_cfg_tokens as run
from tiny_checkpoints import BUILDERS, build_lumina_transformers

torch.set_num_threads(1)
pytestmark = pytest.mark.usefixtures("tiny_lumina_sizes")

FAMILIES = ["lumina_mgpt", "emu3", "janus"]
PRECISIONS = ["none"] + (["int8"] if importlib.util.find_spec("torchao") is not None else [])
PROMPT = "a red cat on the blue field"
# What each family drops, and what it keeps of the same transformers modules.
UNUSED = {
    "lumina_mgpt": ["model.vqmodel"],
    "emu3": ["model.vqmodel.encoder", "model.vqmodel.quant_conv"],
    "janus": ["model.vision_model", "model.aligner", "model.vqmodel.encoder", "model.vqmodel.quant_conv"],
}
USED = {
    "lumina_mgpt": ["model.embed_tokens", "model.layers", "lm_head"],
    "emu3": ["model.vqmodel.decoder", "model.vqmodel.quantize", "model.vqmodel.post_quant_conv", "lm_head"],
    "janus": ["model.vqmodel.decoder", "model.vqmodel.quantize", "model.vqmodel.post_quant_conv",
              "model.generation_embeddings", "model.generation_aligner", "model.generation_head"],
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("kept_parts")
    return {family: BUILDERS[family](root / family) for family in FAMILIES}


def load(folder: Path, precision: str):
    return sp.load_model(folder, dtype="fp32", device="cpu", quantize=precision)


@pytest.fixture(scope="module")
def split(folders, tiny_lumina_sizes):
    return {(family, p): load(folders[family], p) for family in FAMILIES for p in PRECISIONS}


@pytest.fixture(scope="module")
def whole(folders, tiny_lumina_sizes):
    """The same loads with the input embedding kept whole on the device (model ids through the
    model's own embedding), as before the split."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kept_parts, "keep_embedding_rows", lambda model, ids: None)
        return {(family, p): load(folders[family], p) for family in FAMILIES for p in PRECISIONS}


def token_space(model) -> torch.Tensor:
    """The model ids of the sampler's token space (none for Janus-Pro: its codes bypass the text vocabulary)."""
    if model.family == "janus":
        return torch.zeros(0, dtype=torch.long)
    return model.token_model.token_space


def checkpoint_table(folder: Path) -> torch.Tensor:
    """The input embedding as the weight file stores it."""
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        key = next(k for k in f.keys() if k.endswith("embed_tokens.weight"))
        return f.get_tensor(key)


METHODS = (("ar", {}), ("sjd_pac", dict(window=16, tree_width=3)))


def all_tokens(model, seeds=(0, 1)) -> list:
    return [run(model, method, seed, **kw) for seed in seeds for method, kw in METHODS]


# --- where the embedding lives -------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_the_device_holds_the_token_space_rows_and_the_cpu_the_table(split, folders, family):
    model = split[(family, "none")]
    hf, emb = model.model, model.model.get_input_embeddings()
    assert isinstance(emb, EmbeddingRows) and model.token_model.embedding_rows is emb
    ids, table = token_space(model), checkpoint_table(folders[family])
    # Exact copies: the whole table, and the token space's rows in the sampler's order.
    assert emb.table.device.type == "cpu" and torch.equal(emb.table, table)
    assert torch.equal(emb.ids, ids) and torch.equal(emb.rows, table[ids]) and emb.rows.shape[0] < table.shape[0]
    # The rows are a parameter (they move with the model); the table is a buffer (the finite check
    # and the byte count see it) that moving the model leaves in CPU memory.
    assert any(p is emb.rows for p in hf.parameters()) and not any(p is emb.table for p in hf.parameters())
    assert any(b is emb.table for b in hf.buffers())
    moved = copy.deepcopy(emb).to("meta")
    assert moved.rows.device.type == "meta" and moved.table.device.type == "cpu"
    # No other part of the model holds a table-sized matrix (a head tied to it would).
    assert not any(p.shape == table.shape for p in hf.parameters())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_plan_counts_the_rows_on_the_device_and_the_table_beside_it(split, folders, family):
    model = split[(family, "none")]
    emb = model.model.get_input_embeddings()
    table_bytes = emb.table.numel() * emb.table.element_size()
    held = qz.weight_bytes([model.model] + ([model.vqgan] if family == "lumina_mgpt" else []))
    shape = _family_class(FAMILY_CLASSES[family]).memory_shape(read_config(folders[family]), folders[family])
    gpu = plan_memory(shape, torch.device("cuda"), torch.float32, free=None).cost("none")
    assert gpu.host == table_bytes and gpu.weights == held - table_bytes
    assert model.memory_plan.cost("none").weights == held  # on the CPU device, the same memory


@pytest.mark.parametrize("family", FAMILIES)
def test_parts_generation_never_runs_are_not_there(split, family):
    hf = split[(family, "none")].model
    for name in UNUSED[family]:
        with pytest.raises(AttributeError):
            hf.get_submodule(name)
    for name in USED[family]:
        hf.get_submodule(name)


def test_a_transformers_layout_lumina_skips_the_vq_model_in_its_file(tmp_path):
    folder = build_lumina_transformers(tmp_path / "lumina")
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert any(k.startswith("model.vqmodel.") for k in f.keys())
    hf = load(folder, "none").model
    assert not any(name.startswith("model.vqmodel") for name, _ in hf.named_modules())


# --- exactness -------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_tokens_equal_the_whole_embedding_path(split, whole, family, precision):
    new, old = split[(family, precision)], whole[(family, precision)]
    assert isinstance(new.model.get_input_embeddings(), EmbeddingRows)
    assert isinstance(old.model.get_input_embeddings(), torch.nn.Embedding)
    for got, want in zip(all_tokens(new), all_tokens(old)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("part", ["rows", "table"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_planted_embedding_fault_changes_the_tokens(split, whole, family, part):
    """The control: the comparison above fails when the split embedding is wrong - two of its rows
    swapped, among the sampled tokens (rows) or the prompt's (table)."""
    model = split[(family, "none")]
    emb = model.model.get_input_embeddings()
    if part == "rows":
        if emb.rows.shape[0] == 0:
            pytest.skip("Janus-Pro embeds image codes with its own image embedding: no text rows on the device")
        sampled = run(model, "ar", 0).unique()
        a, b = int(sampled[0]), int(sampled[1])
        target = emb.rows
    else:
        prompt = model.encode_prompt(PROMPT).prompt_ids.tolist()
        a = prompt[-1]  # the prompt's last token and the one before it that differs (in every row)
        b = next(t for t in reversed(prompt) if t != a)
        target = emb.table
    want = all_tokens(whole[(family, "none")])
    saved = target.detach().clone()
    try:
        with torch.no_grad():
            target[[a, b]] = saved[[b, a]]
        assert any(not torch.equal(g, w) for g, w in zip(all_tokens(model), want))
    finally:
        with torch.no_grad():
            target.copy_(saved)


def test_compiled_passes_embed_from_the_rows(split, monkeypatch):
    """A compiled pass takes the rows' embeddings as its input (traced without kernels here)."""
    monkeypatch.setattr(causal_lm, "COMPILE_BACKEND", "aot_eager")
    model = split[("emu3", "none")]
    for method, kw in METHODS:
        assert torch.equal(run(model, method, 0, compile=True, **kw), run(model, method, 0, **kw))
