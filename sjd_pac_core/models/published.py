"""The published 7-8B checkpoints' shapes, and the memory table docs/models.md shows for them.

The numbers are the shape fields of each repository's config.json that the plan reads; the rest
of each config is transformers' defaults, which are these models' own (Emu3's text and VQ
configs, Chameleon-7B's VQGAN). `python -m sjd_pac_core.models.published` prints the table; a
test checks that docs/models.md holds exactly what this code computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import torch

from .memory import GB, plan_memory

# family -> (repository, the shape fields of its config.json)
PUBLISHED: Dict[str, Tuple[str, dict]] = {
    "lumina_mgpt": ("Alpha-VLLM/Lumina-mGPT-7B-768", {
        "model_type": "chameleon", "vocab_size": 65536, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    }),
    "emu3": ("BAAI/Emu3-Gen-hf", {
        "model_type": "emu3",
        "text_config": {"vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336,
                        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8},
        "vq_config": {"codebook_size": 32768},
    }),
    "janus": ("deepseek-community/Janus-Pro-7B", {
        "model_type": "janus",
        "text_config": {"model_type": "llama", "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008,
                        "num_hidden_layers": 30, "num_attention_heads": 32, "num_key_value_heads": 32},
        "vq_config": {"num_embeddings": 16384, "embed_dim": 8, "projection_dim": 4096, "image_token_embed_dim": 4096},
    }),
    # Lumina-mGPT 2.0: Chameleon-7B's widths (the 15 GB bf16 download holds 7.9e9 parameters); the
    # vocabulary must reach past the MoVQGAN codes at ids 155,000..171,383 - 172,032 is assumed here
    # (the repository's config.json was not at hand); only the CPU-side embedding table depends on it.
    "lumina_mgpt2": ("Alpha-VLLM/Lumina-mGPT-2.0", {
        "model_type": "chameleon", "vocab_size": 172032, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    }),
}
# Rows of the table: (family, checkpoint folder name, resolution); Lumina-mGPT has one checkpoint per size.
TABLE_ROWS: Tuple[Tuple[str, str, str], ...] = (
    ("lumina_mgpt", "Lumina-mGPT-7B-512", "512x512"),
    ("lumina_mgpt", "Lumina-mGPT-7B-768", "768x768"),
    ("lumina_mgpt", "Lumina-mGPT-7B-1024", "1024x1024"),
    ("emu3", "Emu3-Gen-hf", "720x720"),
    ("janus", "Janus-Pro-7B", "384x384"),
    # One checkpoint; 1024x1024 is not among its sizes (16,513 tokens, past the 10,240 its authors' generate allows).
    ("lumina_mgpt2", "Lumina-mGPT-2.0", "512x512"),
    ("lumina_mgpt2", "Lumina-mGPT-2.0", "768x768"),
)


def family_class(family: str):
    from .loader import FAMILIES, _family_class

    return _family_class(FAMILIES[family])


def published_plans(device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> List[tuple]:
    """(checkpoint, resolution, image tokens, MemoryPlan) of every table row (no free memory)."""
    rows = []
    for family, name, resolution in TABLE_ROWS:
        shape = family_class(family).memory_shape(PUBLISHED[family][1], Path(name))
        plan = plan_memory(shape, torch.device(device), dtype, resolution, free=None)
        rows.append((name, resolution, shape.image_tokens[resolution], plan))
    return rows


def published_table() -> str:
    """Markdown: GB needed on a CUDA GPU, total (weights), with guidance (2 rows) and window 64, and
    the CPU memory that holds the input embedding's table (the same at every precision)."""
    lines = ["| checkpoint | resolution | image tokens | bf16 | int8 | 4-bit | CPU memory |",
             "|---|---|---|---|---|---|---|"]
    for name, resolution, tokens, plan in published_plans():
        cells = [f"{c.total / GB:.1f} ({c.weights / GB:.1f})" for c in plan.costs]
        host = max(c.host for c in plan.costs)
        lines.append(f"| {name} | {resolution} | {tokens:,} | " + " | ".join(cells) + f" | {host / GB:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    import argparse

    argparse.ArgumentParser(
        description="Print the memory table of the published 7-8B checkpoints (docs/models.md)."
    ).parse_args(argv)
    print(published_table())


if __name__ == "__main__":
    main()
