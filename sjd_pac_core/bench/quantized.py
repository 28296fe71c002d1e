"""Weight-only quantization, measured: weight bytes, resident memory, AR and SJD-PAC time per token.

    python benchmarks/quant_bench.py --out runs/quant              # the CPU target: a ~100M Llama, fp32/int8/4bit
    python benchmarks/quant_bench.py --tiny --out runs/quant_tiny  # seconds: proves the command runs

A random Llama of the given shape (its head scaled up so that the conditionals are peaked and
drafts get accepted) is saved once as a safetensors checkpoint, then loaded at each precision
through transformers' from_pretrained with the same quantization_config load_model builds (the
decoder layers' linears only). The timed runs interleave the precisions and the methods in every
round (AR, then SJD-PAC, same prompt and seed, verify="gumbel", CFG), so a drifting machine hits
all alike; time per token is the median over rounds. Memory is measured per precision in a
fresh process on the CPU (after the load and at its peak). Counts (weight bytes, passes, step
compression, identical tokens) do not depend on the machine. benchmarks/gpu_bench.py runs the
same rows on the 7B shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from .. import arguments

PRECISIONS = ("none", "int8", "4bit")


def resident_bytes(kind: str = "VmRSS") -> Optional[int]:
    """This process's resident set from /proc/self/status (Linux): VmRSS (all), RssAnon (its own
    memory), RssFile (mapped files' pages, which the OS can drop and read again), VmHWM (the
    peak); None elsewhere."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, and they count as resident)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def cpu_load_memory(cls, folder: Path, precision: str, dtype: torch.dtype) -> Dict[str, Optional[int]]:
    """Memory that loading at `precision` takes on the CPU, in a fresh process, less its own after
    importing torch and transformers: the peak of the load, and after one forward pass (which reads
    every weight) with freed heap pages handed back, the process's own memory and the mapped pages
    (weights read straight from the safetensors file stay file pages, which the OS can drop under
    pressure and read again; library code the pass touches first adds some 30 MB). Measured in
    this process, the other precisions' freed pages would be reused and mean little."""
    script = ("import json, sys, warnings, importlib, torch, transformers\n"
              "from pathlib import Path\n"
              "from sjd_pac_core.bench import quantized as q\n"
              "module, name, folder, precision, dtype = sys.argv[1:]\n"
              "cls = getattr(importlib.import_module(module), name)\n"
              "base = {kind: q.resident_bytes(kind) for kind in ('RssAnon', 'RssFile', 'VmRSS')}\n"
              "warnings.simplefilter('ignore')\n"
              "model = q.load_at(cls, Path(folder), precision, getattr(torch, dtype), torch.device('cpu'))\n"
              "peak = q.resident_bytes('VmHWM') - base['VmRSS']\n"
              "with torch.no_grad():\n"
              "    model(torch.ones(1, 1, dtype=torch.long))  # a pass reads every weight: mapped pages count\n"
              "q.release_freed_memory()\n"
              "print(json.dumps({'own': q.resident_bytes('RssAnon') - base['RssAnon'], 'peak': peak,\n"
              "                  'mapped': q.resident_bytes('RssFile') - base['RssFile']}))\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", script, cls.__module__, cls.__name__, str(folder), precision,
                           str(dtype).replace("torch.", "")], capture_output=True, text=True, env=env)
    if done.returncode != 0 or not done.stdout.strip():
        return {"own": None, "mapped": None, "peak": None}
    return json.loads(done.stdout.strip().splitlines()[-1])


def save_random_checkpoint(shape, dtype: torch.dtype, device: torch.device, folder: Path, head_scale: float,
                           seed: int = 0) -> type:
    """The shape's random transformers model (the same weights for the same seed), saved as
    safetensors; returns its class."""
    from .shapes import build_random_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_random_model(shape, dtype, device)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(head_scale)
    model.save_pretrained(folder)
    cls = type(model)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return cls


def load_at(cls, folder: Path, precision: str, dtype: torch.dtype, device: torch.device):
    """from_pretrained at one precision, quantized as load_model quantizes (the decoder layers)."""
    from ..models.quantize import quantization_config, scheme_for

    kwargs = {"dtype": dtype}
    scheme = scheme_for(precision, device)
    if scheme is not None:
        in_features = _layer_in_features(folder)
        kwargs["quantization_config"] = quantization_config(scheme, dtype, r"model\.layers", in_features)
    if device.type != "cpu":
        kwargs["device_map"] = {"": str(device)}
    model = cls.from_pretrained(folder, **kwargs).eval()
    return model if device.type != "cpu" else model.to(device)


def _layer_in_features(folder: Path) -> List[int]:
    """Input widths of the decoder layers' linear weights, from the safetensors header."""
    from ..models.checks import read_safetensors_header

    widths = set()
    for path in folder.glob("*.safetensors"):
        for name, entry in read_safetensors_header(path).items():
            if ".layers." in name and name.endswith("proj.weight") and len(entry["shape"]) == 2:
                widths.add(int(entry["shape"][1]))
    return sorted(widths)


def quantized_rows(shape, device: torch.device, precisions: Sequence[str] = PRECISIONS, tokens: int = 64,
                   rounds: int = 3, window: int = 32, cfg_scale: float = 3.0, head_scale: float = 8.0,
                   seed: int = 0) -> Dict[str, object]:
    """Per precision: weight bytes, memory after loading, AR and SJD-PAC seconds per token (median
    over interleaved rounds), SJD-PAC's step compression, and whether both gave the same tokens."""
    from ..config import SamplerConfig
    from ..engine.loop import sample_tokens
    from ..models.causal_lm import CausalLMAdapter
    from ..models.quantize import quantized_modules, weight_bytes
    from .shapes import image_token_ids, text_vocab

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, text_vocab(shape), (shape.prompt_tokens,), generator=g)
    uncond = prompt[:4].clone()
    configs = {"ar": SamplerConfig(method="ar", verify="gumbel", cfg_scale=cfg_scale),
               "sjd_pac": SamplerConfig(method="sjd_pac", window=window, verify="gumbel", cfg_scale=cfg_scale)}
    rows: Dict[str, Dict[str, object]] = {}
    adapters = {}
    with tempfile.TemporaryDirectory(prefix="sjd_pac_quant_") as tmp:
        cls = save_random_checkpoint(shape, dtype, device, Path(tmp), head_scale, seed)
        for precision in precisions:
            if device.type == "cuda":  # the allocator's own count is exact: around the load itself
                torch.cuda.synchronize(device)
                before = int(torch.cuda.memory_allocated(device))
            else:
                memory = cpu_load_memory(cls, Path(tmp), precision, dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = load_at(cls, Path(tmp), precision, dtype, device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                memory = {"own": int(torch.cuda.memory_allocated(device)) - before, "mapped": None, "peak": None}
            adapters[precision] = CausalLMAdapter(model, token_space=image_token_ids(shape, device))
            rows[precision] = {"precision": precision, "weight_bytes": weight_bytes([model]),
                               "quantized_linears": len(quantized_modules(model)),
                               "memory_own_bytes": memory["own"], "memory_mapped_bytes": memory["mapped"],
                               "memory_peak_bytes": memory["peak"],
                               "seconds_per_token": {m: [] for m in configs}, "tokens": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for precision in precisions:  # warm-up: allocator, kernels, the first pass of each size
            sample_tokens(adapters[precision], prompt, min(tokens, 8), config=configs["sjd_pac"], seed=seed,
                          uncond_prompt_ids=uncond)
        order = list(precisions)
        for r in range(rounds):
            order = order[1:] + order[:1]  # rotate which precision goes first
            for precision in order:
                for method, config in configs.items():
                    start = time.perf_counter()
                    result = sample_tokens(adapters[precision], prompt, tokens, config=config, seed=seed,
                                           uncond_prompt_ids=uncond)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    row = rows[precision]
                    row["seconds_per_token"][method].append((time.perf_counter() - start) / tokens)
                    row["tokens"][method] = result.tokens.tolist()
                    if method == "sjd_pac":
                        row["step_compression"] = result.stats.step_compression
                        row["passes"] = result.stats.forward_passes
    for row in rows.values():
        row["seconds_per_token"] = {m: statistics.median(v) for m, v in row["seconds_per_token"].items()}
        row["sjd_pac_equals_ar"] = row["tokens"]["sjd_pac"] == row["tokens"]["ar"]
        row["speedup"] = row["seconds_per_token"]["ar"] / row["seconds_per_token"]["sjd_pac"]
        del row["tokens"]
    base = rows[precisions[0]]["seconds_per_token"]
    for row in rows.values():
        row["ar_time_vs_first"] = row["seconds_per_token"]["ar"] / base["ar"]
    return {"shape": shape.name, "device": str(device), "dtype": str(dtype).replace("torch.", ""), "tokens": tokens,
            "rounds": rounds, "window": window, "cfg_scale": cfg_scale, "rows": list(rows.values())}


def markdown(result: Dict[str, object]) -> str:
    lines = [f"### Weight-only quantization: {result['shape']} on {result['device']} ({result['dtype']}), "
             f"{result['tokens']} image tokens, CFG {result['cfg_scale']}, SJD-PAC L={result['window']}, "
             f"median of {result['rounds']} interleaved rounds", "",
             "| precision | weight MB | own memory MB | mapped checkpoint MB | peak while loading MB | AR ms/token | SJD-PAC ms/token | "
             "SJD-PAC speedup | step compression | AR time vs first row | SJD-PAC tokens = AR |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]

    def megabytes(value: Optional[int]) -> str:
        return "-" if value is None else f"{value / 1e6:.0f}"

    for row in result["rows"]:
        lines.append(f"| {row['precision']} | {row['weight_bytes'] / 1e6:.0f} | {megabytes(row['memory_own_bytes'])} | "
                     f"{megabytes(row['memory_mapped_bytes'])} | {megabytes(row['memory_peak_bytes'])} | "
                     f"{1000 * row['seconds_per_token']['ar']:.2f} | {1000 * row['seconds_per_token']['sjd_pac']:.2f} | "
                     f"{row['speedup']:.2f}x | {row['step_compression']:.2f}x | {row['ar_time_vs_first']:.2f} | "
                     f"{'yes' if row['sjd_pac_equals_ar'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from .shapes import CPU_SHAPES, SHAPES, TINY_SHAPES, Shape

    shapes = {**CPU_SHAPES, **SHAPES, **TINY_SHAPES,
              "llama-100m": Shape("llama-100m", "llama", 768, 2048, 12, 12, 12, 8192 + 256, 8192, 32, 256,
                                  "Llama ~100M, 8,192 image codes")}
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", default="llama-100m", choices=sorted(shapes))
    p.add_argument("--tiny", action="store_true", help="a tiny shape, 8 tokens, 1 round: proves the command runs")
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    p.add_argument("--tokens", type=arguments.whole(1, 1_000_000), default=256, help="image tokens per run (default 256)")
    p.add_argument("--rounds", type=arguments.whole(1, 10_000), default=5)
    p.add_argument("--window", type=arguments.whole(1, 1024), default=32)
    p.add_argument("--threads", type=arguments.threads(allow_default=False), default=1, help="torch CPU threads (default 1)")
    p.add_argument("--out", default="runs/quant_bench")
    args = p.parse_args(argv)

    from ..models.loader import resolve_device

    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    shape = shapes[args.shape]
    if args.tiny:
        shape = Shape("llama-tiny", "llama", 64, 128, 2, 4, 4, 512, 256, 8, 64, "tiny Llama (check only)")
    result = quantized_rows(shape, device, [q for q in args.precisions.split(",") if q],
                            tokens=8 if args.tiny else args.tokens, rounds=1 if args.tiny else args.rounds,
                            window=8 if args.tiny else args.window)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_bench.json").write_text(json.dumps(result, indent=1, default=float))
    report = markdown(result)
    (out / "quant_bench.md").write_text(report + "\n")
    print(report)
    return 0
