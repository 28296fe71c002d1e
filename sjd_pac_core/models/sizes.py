"""Every output size the supported families offer with their published checkpoints.

For lists that must exist before a checkpoint is loaded (ComfyUI's resolution input is a static
list); a loaded model's own sizes are `model.defaults.resolutions`, and asking it for another one
is a one-sentence error that lists them. No model code is imported here (it is cheap to import).
"""

from __future__ import annotations

from typing import Dict, Tuple

PIXELS_PER_GRID = 32  # Lumina-mGPT's patch: one size token per 32 pixels (2 codes)
MAX_ASPECT_RATIO = 4.0  # Lumina-mGPT's crop-size rule
LUMINA_TARGETS = (512, 768, 1024)  # Alpha-VLLM/Lumina-mGPT-7B-512 / -768 / -1024
# Alpha-VLLM/Lumina-mGPT-2.0: one checkpoint; the sizes at the README's 768 px area, then at 512
# (the target its inference solver defaults to).
LUMINA2_TARGETS = (768, 512)
# Emu3's five ratios at its default area 720*720 (Emu3Processor.calculate_generate_size, 8 px per
# token); a checkpoint with another `image_area` gets its own (tests check these).
EMU3_RESOLUTIONS = ("720x720", "832x624", "624x832", "960x544", "544x960")
DEMO_RESOLUTIONS = ("64x64",)
JANUS_RESOLUTIONS = ("384x384",)


def trained_sizes(target: int, patch: int = PIXELS_PER_GRID, max_ratio: float = MAX_ASPECT_RATIO) -> Tuple[Tuple[int, int], ...]:
    """(width, height) pairs a checkpoint of this target size was trained on, square first.

    The rule of Lumina-mGPT's crop-size list: n = (target/patch)^2 patches; walking the width w
    (in patches) down from n, the heights h run from floor(n/(w+1)) (1 for w = n) up to
    floor(n/w); every (w, h) with aspect ratio at most max_ratio is a size.
    """
    n = (target // patch) ** 2
    pairs = []
    for w in range(n, 0, -1):
        for h in range(max(1, n // (w + 1)), n // w + 1):
            if max(w, h) / min(w, h) <= max_ratio:
                pairs.append((w * patch, h * patch))
    square = (target, target)
    return (square, *[p for p in pairs if p != square])


def family_resolutions() -> Dict[str, Tuple[str, ...]]:
    """family -> its sizes ("WxH", default first); Lumina-mGPT's over its three checkpoints."""
    lumina: Dict[str, None] = {}
    for target in LUMINA_TARGETS:
        lumina.update(dict.fromkeys(f"{w}x{h}" for w, h in trained_sizes(target)))
    lumina2: Dict[str, None] = {}
    for target in LUMINA2_TARGETS:
        lumina2.update(dict.fromkeys(f"{w}x{h}" for w, h in trained_sizes(target)))
    return {"demo": DEMO_RESOLUTIONS, "janus": JANUS_RESOLUTIONS, "emu3": EMU3_RESOLUTIONS,
            "lumina_mgpt": tuple(lumina), "lumina_mgpt2": tuple(lumina2)}


def known_resolutions() -> Tuple[str, ...]:
    """The union of every family's sizes, each once, in family order."""
    seen: Dict[str, None] = {}
    for sizes in family_resolutions().values():
        seen.update(dict.fromkeys(sizes))
    return tuple(seen)
