"""Before a run: is this pass shape expected to be slower than plain AR on the model's device?

A forward pass of SJD / SJD-PAC with a fixed window L scores 1 + L + (tree side nodes) tokens at once;
plain AR scores one. What such a pass costs, relative to AR's, is the window cost curve that
window="auto" chooses L from (engine/window.py: `measure_cost_curve`, measured on the live model and
cached per model and device). A run beats AR only if each pass commits more tokens than it costs AR
passes. No configuration has committed more than MOST_TOKENS_PER_PASS tokens per pass in this
project's measurements, so a pass that costs more than that is expected to be slower than AR,
whatever it accepts. The measurement is a few passes of the model (milliseconds on a GPU or for
the demo model), made once per model, device and shape.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .config import SamplerConfig
from .engine.window import CostCurve, cached_cost_curve, measure_cost_curve
from .models.image_model import ARImageModel, PromptEncoding

# Tokens per forward pass: the most any configuration reached in docs/benchmark.md ("Drafting": 6.04x
# at L = 64 with 16 candidates per chain position, 6.44x with chain width 3); the paper's Lumina-mGPT
# runs reach about 3.5x. A pass dearer than this many one-token passes cannot pay for itself.
MOST_TOKENS_PER_PASS = 6.5
REPEATS = 5  # the fastest of 5 passes of each size counts: a busy machine slows some of them


def pass_nodes(config: SamplerConfig) -> int:
    """Tokens the largest pass of a fixed-window run scores: the root, then L drafts and the tree's
    side nodes, or the node budget."""
    return 1 + config.pass_nodes


def slower_than_ar(config: SamplerConfig, cost: CostCurve, device: str = "this device") -> Optional[str]:
    """One sentence when a pass of `config`'s shape costs more one-token passes than any run has
    committed tokens per pass (so the run is expected to be slower than AR); None otherwise."""
    if config.method == "ar" or config.auto_window or config.node_budget == "auto":
        return None  # AR is AR; window="auto" chooses L (and the tree) from this very curve, as a budget "auto" B
    nodes = pass_nodes(config)
    ratio = cost(nodes) / max(cost(1), 1e-12)
    if ratio <= MOST_TOKENS_PER_PASS or ratio > nodes:
        return None  # cheap enough; or dearer than `nodes` separate passes, which is timer noise (a busy machine)
    tree = f" and a {config.tree_side_nodes}-node tree" if config.tree_side_nodes else ""
    shape = f"node budget {config.node_budget}" if config.node_budget is not None else f"L = {config.window}{tree}"
    return (f"A pass of {shape} ({nodes} tokens) costs about {ratio:.0f} one-token passes on "
            f"{device}, more than the {MOST_TOKENS_PER_PASS:g} tokens per pass any setting has reached, so this "
            "run is expected to be slower than AR; use a smaller L, D, K or node budget, or L = 'auto'.")


def cost_curve(model: ARImageModel, encoding: PromptEncoding, config: SamplerConfig,
               sizes: Optional[Sequence[int]] = None) -> CostCurve:
    """The window cost curve of `model` on its device: the one window="auto" measured, if it ran,
    else AR's pass and this shape's pass, timed on a session over the run's own prompts."""
    sizes = tuple(sizes or (1, pass_nodes(config)))
    known = cached_cost_curve(model.token_model) or cached_cost_curve(model.token_model, sizes=sizes)
    if known is not None:  # (beyond its largest size a curve extrapolates its last slope)
        return known
    prompts = [encoding.prompt_ids]
    if config.uses_cfg and encoding.uncond_ids is not None:
        prompts.append(encoding.uncond_ids)
    session = model.token_model.open_session(prompts)
    try:
        session.configure(max(sizes) + 1)
        with torch.inference_mode():
            root = session.prefill()[0].argmax()
            return measure_cost_curve(model.token_model, session, root, sizes=sizes, repeats=REPEATS)
    finally:
        session.close()


def slow_shape_warning(model: ARImageModel, encoding: PromptEncoding, config: SamplerConfig) -> Optional[str]:
    """`slower_than_ar` for a run about to start (measuring the curve if needed)."""
    if (config.method == "ar" or config.auto_window or config.node_budget == "auto"
            or pass_nodes(config) <= MOST_TOKENS_PER_PASS):
        return None  # nothing to measure: a pass of that few tokens costs at most that many passes
    device = "the GPU" if model.device.type == "cuda" else ("the Mac's GPU" if model.device.type == "mps"
                                                          else "this CPU")
    return slower_than_ar(config, cost_curve(model, encoding, config), device)

