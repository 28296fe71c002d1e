"""The bundled demo text-to-image model: a small transformers LM, a VQ tokenizer and its weights.

The runtime (what `load_model("demo")` needs) lives here:

    captions.py   the picture language: colours, shapes, sizes, places; reading prompts (no torch)
    vocab.py      the token vocabulary and layout
    vq.py         the VQ image tokenizer (decoder)
    model.py      loading the weights; a batched reference AR sampler
    weights/      the shipped weights

The tools that made and measured it stand apart, in tools/ (procedural data, training, the
quality check, calibration): rebuild it with ``python -m sjd_pac_core.demo.tools.train``, check
its pictures with ``python -m sjd_pac_core.demo.tools.quality``, measure how a speculative
sampler sees it with ``python -m sjd_pac_core.demo.tools.calibrate``.
"""

from pathlib import Path

# The prompt the README, the app, the ComfyUI nodes and the demo workflows start with: chosen with
# the strict check (`python -m sjd_pac_core.demo.tools.quality --prompts ...`) on held-out seeds.
EXAMPLE_PROMPT = "a large orange circle top right on a blue background"

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"  # the shipped demo folder
VOCAB_FILE = "vocab.json"  # a demo folder's vocabulary (captions.check_prompt reads it before loading)


def quantize_refusal(asked: str, fix: str) -> str:
    """The one sentence that refuses to quantize the demo model (the CLI before torch, load_model)."""
    return (f"{asked} is for the real families (Lumina-mGPT, Emu3 and Janus-Pro, 7B models); the demo model "
            f"has 1.7M parameters and loads whole in full precision, so {fix}.")
