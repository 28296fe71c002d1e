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
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import sjd_pac_core as sp
from sjd_pac_core.models import chameleon_vqgan, emu3 as emu3_mod, janus as janus_mod, loader, lumina_mgpt
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


@pytest.fixture
def no_weights(monkeypatch):
    """Any weight read fails the test: the refusal must come first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("weights were read before the input was checked")

    for module in (lumina_mgpt, emu3_mod, janus_mod):
        monkeypatch.setattr(module, "load_pretrained", forbidden)
    monkeypatch.setattr(lumina_mgpt, "load_chameleon_vqgan", forbidden)


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
