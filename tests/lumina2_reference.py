"""Run Lumina-mGPT 2.0's own code on a tiny checkpoint and write what the conformance tests compare.

    python tests/lumina2_reference.py --src <checkout of github.com/Alpha-VLLM/Lumina-mGPT-2.0> \\
        --folder <build_lumina2 folder> --out reference.json

Needs an environment the authors' code runs in: transformers 4.46 (their requirements pin 4.46.2;
transformers 5 removed what their Chameleon class imports) and einops. Nothing of theirs is copied
here: their modules are imported from the checkout. Three of their imports are of libraries the
text-to-image path never calls, stubbed so that they need not be installed: pytorch_lightning
(MOVQ's base class: only nn.Module is used), sentencepiece (their tokenizer wrapper's SPM branch;
this checkpoint has an HF tokenizer) and torchvision (image transforms of their training data).
Their inference code hard-codes CUDA tensors; on a CPU-only machine "cuda" is mapped to the CPU.

What is run, for each (resolution, CFG scale):
* prompt ids: their FlexARItemProcessor.process_item on the conversation their generate builds
  (`[[f"Generate an image of {W}x{H} according to the following prompt:\\n{prompt}", None]]`),
  then <racm3:break> h w appended (their generate samples those three; a random model cannot);
* tokens: the model's generate with their logits processors (FlexARInferenceSolver.
  create_logits_processor: their CFG, image-constraint and top-k processors) and their stop token
  151666, greedy (do_sample=False), with output_scores: p along the path;
* pixels: their decode_ids on the generated tokens (MoVQGAN's decode_code and their show_images)
  of the non-square run, as uint8; and MoVQGAN's decode_code on a fixed code grid (float pixels);
* the crop-size lists their code makes at 768 and 512, and for every size in them, what their
  constraint processor allows at the row ends and the end of the image.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import importlib.machinery
import json
import os
import sys
import tempfile
import types
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_checkpoints import TINY_MOVQ  # noqa: E402

PROMPT = "a red cat on the blue field"
RUNS = (("96x96", 4.0), ("96x96", 1.0), ("96x96", 3.0), ("128x64", 4.0))
TOP_K = 20
IMAGE_RUN = "128x64|4.0"  # the run whose decoded image is kept (non-square: rows and columns differ)
P_STEPS = (0, 1, 2, 5, 12, 13, 155, 156)
DECODER_GRID = (4, 6)  # codes: 32 x 48 pixels
IMAGE_START, IMAGE_END, END_OF_LINE, OFFSET, CODES = 151665, 151666, 151670, 155000, 16384


def pack(array: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.ascontiguousarray(array).tobytes(), 9)).decode()


def unpack(text: str, dtype, shape) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype=dtype).reshape(shape)


def decoder_codes() -> torch.Tensor:
    rows, cols = DECODER_GRID
    return torch.randint(0, CODES, (rows, cols), generator=torch.Generator().manual_seed(0))


def _stub(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
    return module


def install_stubs() -> None:
    """The three libraries named in the module doc, where they are not installed."""
    import importlib.util

    if importlib.util.find_spec("pytorch_lightning") is None:
        _stub("pytorch_lightning", LightningModule=torch.nn.Module)
    if importlib.util.find_spec("sentencepiece") is None:
        _stub("sentencepiece", SentencePieceProcessor=object)
    if importlib.util.find_spec("torchvision") is None:
        tv = _stub("torchvision")
        tv.transforms = _stub("torchvision.transforms")


def map_cuda_to_cpu() -> None:
    """Their processors build tensors with device="cuda" and decode_ids calls .cuda()."""
    if torch.cuda.is_available():
        return

    def cpu(fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)
        return wrapped

    for name in ("tensor", "arange", "full", "zeros", "ones"):
        setattr(torch, name, cpu(getattr(torch, name)))
    torch.Tensor.cuda = lambda self, *a, **k: self


def run(src: Path, folder: Path) -> dict:
    install_stubs()
    map_cuda_to_cpu()
    sys.path[:0] = [str(src / "lumina_mgpt"), str(src)]
    import data.item_processor as item_processor  # noqa: E402 - from their checkout
    import inference_solver  # noqa: E402
    from movqgan import get_movqgan_model  # noqa: E402
    from transformers import GenerationConfig

    # Their get_movqgan_model reads {cache_dir}/270M/movqgan_270M.ckpt with the 270M ddconfig; the
    # tiny checkpoint's file and ddconfig instead, through the same function.
    cache = Path(tempfile.mkdtemp()) / "270M"
    cache.mkdir()
    os.symlink(folder / "movqgan_270M.ckpt", cache / "movqgan_270M.ckpt")
    item_processor.get_movqgan_model = functools.partial(
        get_movqgan_model, cache_dir=str(cache.parent), ddconfig=TINY_MOVQ["ddconfig"],
        n_embed=TINY_MOVQ["n_embed"], embed_dim=TINY_MOVQ["embed_dim"])

    solver = inference_solver.FlexARInferenceSolver(model_path=str(folder), precision="fp32", target_size=768,
                                                    device="cpu")
    # Their processors each build a FlexARItemProcessor with the hub's tokenizer name: give them
    # the solver's own (the same class, on this folder).
    inference_solver.FlexARItemProcessor = lambda *args, **kwargs: solver.item_processor
    proc = solver.item_processor
    out: dict = {"prompt_ids": {}, "tokens": {}, "p": {}}
    for resolution, cfg in RUNS:
        width, height = (int(v) for v in resolution.split("x"))
        question = f"Generate an image of {width}x{height} according to the following prompt:\n{PROMPT}"
        item = {"image": [], "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": None}]}
        prompt = proc.process_item(item)
        prompt += [IMAGE_START, proc.token2id(proc.get_n_grids_token(height // 32)),
                   proc.token2id(proc.get_n_grids_token(width // 32))]
        out["prompt_ids"][resolution] = prompt
        n_tokens = (height // 8) * (width // 8 + 1) + 1
        config = GenerationConfig(max_new_tokens=n_tokens, max_length=solver.model.config.max_position_embeddings,
                                  do_sample=False, eos_token_id=[IMAGE_END], output_scores=True,
                                  return_dict_in_generate=True)
        generated = solver.model.generate(torch.tensor([prompt]), config,
                                          logits_processor=solver.create_logits_processor(cfg=cfg, image_top_k=TOP_K))
        tokens = generated.sequences[0, len(prompt):].tolist()
        key = f"{resolution}|{cfg}"
        out["tokens"][key] = tokens
        if cfg == 4.0:
            steps = [t for t in P_STEPS if t < len(tokens)]
            p = [torch.softmax(generated.scores[t][0].float(), -1) for t in steps]
            out["p"][resolution] = [(t, pt.topk(3).indices.tolist(), pt.topk(3).values.tolist())
                                    for t, pt in zip(steps, p)]
        if key == IMAGE_RUN:
            _, images = solver.decode_ids(prompt[-3:] + tokens)
            out["image_uint8"] = pack(np.asarray(images[0].convert("RGB"), dtype=np.uint8))
    codes = decoder_codes()
    with torch.no_grad():
        pixels = proc.vqgan.decode_code(codes.reshape(1, -1), *codes.shape)
    out["decoder_pixels"] = pack(pixels[0].float().numpy())
    out["decoder_uint8"] = pack(np.asarray(solver.show_images(pixels)))
    out["crop_sizes"] = {str(t): item_processor.generate_crop_size_list((t // 32) ** 2, 32) for t in (768, 512)}
    out["forced"] = forced_positions(solver, out["crop_sizes"])
    return out


def forced_positions(solver, crop_sizes: dict) -> dict:
    """size -> [(k, what their constraint processor allows for image token k)] at the ends of the
    first two rows, the last row and the image: the forced id, or -1 where it allows exactly the
    16384 image codes."""
    proc = solver.item_processor
    constraint = solver.create_logits_processor(cfg=1.0, image_top_k=TOP_K)[1]
    found = {}
    for width, height in [s for sizes in crop_sizes.values() for s in sizes]:
        rows, cols = height // 8, width // 8
        start = [IMAGE_START, proc.token2id(proc.get_n_grids_token(height // 32)),
                 proc.token2id(proc.get_n_grids_token(width // 32))]
        probes = []
        for k in sorted({0, cols - 1, cols, cols + 1, 2 * cols + 1, rows * (cols + 1) - 1, rows * (cols + 1)}):
            constraint.image_start_token_id_index = None  # a fresh image, as a new processor starts
            constraint.h_latent_dim = constraint.w_latent_dim = None
            ids = torch.tensor([[0] + start + [OFFSET] * k])
            with contextlib.redirect_stdout(sys.stderr):  # their processor prints
                scores = constraint(ids, torch.zeros(1, solver.model.config.vocab_size))
            allowed = torch.isfinite(scores[0]).nonzero().flatten()
            if allowed.numel() == 1:
                probes.append((k, int(allowed[0])))
            else:
                assert allowed.tolist() == list(range(OFFSET, OFFSET + CODES)), (width, height, k)
                probes.append((k, -1))
        found[f"{width}x{height}"] = probes
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = run(args.src.resolve(), args.folder.resolve())
    import transformers

    result["produced_by"] = (f"tests/lumina2_reference.py with transformers {transformers.__version__}, torch "
                             f"{torch.__version__}, on the folder build_lumina2(seed=0) writes")
    args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
