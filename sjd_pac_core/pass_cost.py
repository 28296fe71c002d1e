"""Is this run slower than plain AR on the model's device? Said once, with the measured figures.

A forward pass of SJD / SJD-PAC with a fixed window L scores 1 + L + (tree side nodes) tokens at once;
plain AR scores one. What such a pass costs, relative to AR's, is the window cost curve that
window="auto" chooses L from (engine/window.py: `measure_cost_curve`, measured on the live model and
cached per model and device). A run beats AR only if its passes commit more tokens than they cost
one-token passes. Two checks follow from that, neither with a figure of its own:

- before the run, the certain case: a pass commits at most L + 1 tokens (its accepted run along the
  main chain and one token after it), so a pass that costs more one-token passes than that is slower
  than AR whatever it accepts (`slower_than_ar`);
- during the run, the expected case: once a quarter of the image is committed (JUDGED_SHARE), the
  tokens the run's passes committed are set against what its fastest pass cost, in one-token passes
  (`running_slower_than_ar`, through `RunPace.during`). Both figures are measured: the first passes of
  an image accept far fewer tokens than later ones, and a pass's fastest time, like the probe's
  one-token time, leaves out what a busy machine adds to some passes, so the two compare like with like.

The measurement is a few passes of the model (milliseconds on a GPU or for the demo model), made once
per model, device and shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

import torch

from .config import SamplerConfig
from .engine.stats import RunStats
from .engine.window import CostCurve, cached_cost_curve, measure_cost_curve
from .models.image_model import ARImageModel, PromptEncoding

REPEATS = 5  # the fastest of 5 passes of each size counts: a busy machine slows some of them
# The share of the image committed before a run's pace is judged: a policy, not a measured figure.
# The first rows accept far fewer tokens per pass than the rest (a shorter stretch misjudges good
# runs); a longer one would say it when most of the run is spent.
JUDGED_SHARE = 0.25
# The one-token cost comes from a probe timed once per process, maybe under another load (probes
# of one shape ranged 1.6-3.5 on a busy CPU), so a run is called slower only when its passes cost
# this much more than the tokens they commit: a chosen margin, not a measured result.
CLEARLY_SLOWER = 1.5
AUTO_WORDS = "L = 'auto'"  # how a front end spells the automatic window (the nodes: window 0)
BUDGET_AUTO_WORDS = "node budget 'auto'"  # ...and the automatic node budget (the nodes: node_budget -1)


def pass_nodes(config: SamplerConfig) -> int:
    """Tokens the largest pass of a fixed-window run scores: the root, then L drafts and the tree's
    side nodes, or the node budget."""
    return 1 + config.pass_nodes


def most_tokens_per_pass(config: SamplerConfig) -> int:
    """The most tokens one pass can commit: its accepted run along the main chain (L drafts at most;
    a tree branch or side chain is never longer; a node budget's chain at most B, and at most L
    where a window is given) and the one token sampled after it."""
    chain = config.window_size
    if config.node_budget is not None:
        chain = min(chain or config.pass_nodes, config.pass_nodes)
    return chain + 1


def pass_ratio(cost: CostCurve, nodes: float) -> Optional[float]:
    """What a pass of `nodes` tokens costs in one-token passes; None when the curve says more than
    `nodes` separate passes, which is timer noise (a busy machine), not the shape's cost."""
    return _unless_noise(cost(nodes) / max(cost(1), 1e-12), nodes)


def _unless_noise(ratio: float, nodes: float) -> Optional[float]:
    return None if ratio > nodes else ratio


def _fix(config: SamplerConfig, auto: str, window: bool = True, budget_auto: str = BUDGET_AUTO_WORDS) -> str:
    """The fix: a smaller pass (the tree alone when a smaller L cannot help), or the automatic window.
    A node budget sizes its own tree (D and K are not used) within L: a smaller budget makes the
    pass cheaper, a larger L lets it commit more, and the automatic budget picks B by the clock."""
    if config.node_budget is not None:
        return f"use a smaller node budget or a larger L, or {budget_auto}"
    if not config.tree_side_nodes:
        return f"use a smaller L or {auto}"
    return f"use a smaller L, D or K, or {auto}" if window else f"use a smaller D or K, or {auto}"


def _judged(config: SamplerConfig) -> bool:
    # window="auto" picks L (and the tree) from the curve, as node_budget="auto" picks B; under a
    # fixed budget window="auto" (what a budget alone gets) times nothing: the budget is judged
    timed_window = config.auto_window and config.node_budget is None
    return config.method != "ar" and not timed_window and config.node_budget != "auto"


def slower_than_ar(config: SamplerConfig, cost: CostCurve, device: str = "this device",
                   auto: str = AUTO_WORDS, budget_auto: str = BUDGET_AUTO_WORDS) -> Optional[str]:
    """Before the run: one sentence when a pass of `config`'s shape costs more one-token passes than
    it can commit tokens (so the run is certainly slower than AR); None otherwise."""
    if not _judged(config):
        return None
    nodes, most = pass_nodes(config), most_tokens_per_pass(config)
    ratio = pass_ratio(cost, nodes)
    if ratio is None or ratio <= most:
        return None
    tree = f" and a {config.tree_side_nodes}-node tree" if config.tree_side_nodes else ""
    shape = f"node budget {config.node_budget}" if config.node_budget is not None else f"L = {config.window}{tree}"
    return (f"A pass of {shape} ({nodes} tokens) costs about {ratio:.1f} one-token passes on "
            f"{device}, more than the {most} tokens a pass can commit, so this run will be slower than AR; "
            f"{_fix(config, auto, window=False, budget_auto=budget_auto)}.")


def running_slower_than_ar(config: SamplerConfig, passes: int, tokens_per_pass: float, ratio: float,
                           device: str = "this device", auto: str = AUTO_WORDS,
                           budget_auto: str = BUDGET_AUTO_WORDS) -> Optional[str]:
    """During the run: one sentence when its `passes` passes committed clearly fewer tokens each
    (by CLEARLY_SLOWER) than its fastest pass cost one-token passes (`ratio`), so the run is going
    slower than AR; None otherwise."""
    if not _judged(config) or tokens_per_pass * CLEARLY_SLOWER >= ratio:
        return None
    return (f"Its first {passes} passes committed {tokens_per_pass:.2f} tokens each, but even the fastest of them "
            f"cost {ratio:.2f} one-token passes on {device}, so this run is going slower than AR; "
            f"{_fix(config, auto, budget_auto=budget_auto)}.")


@dataclass
class RunPace:
    """A run's pace against AR: the certain case before it (`before`), and the measured one once
    (`during`, called after every pass with the run's statistics). Says nothing without a curve."""

    config: SamplerConfig
    cost: Optional[CostCurve]
    device: str = "this device"
    auto: str = AUTO_WORDS
    budget_auto: str = BUDGET_AUTO_WORDS
    judged: bool = field(default=False, init=False)

    @property
    def before(self) -> Optional[str]:
        if self.cost is None:
            return None
        return slower_than_ar(self.config, self.cost, self.device, self.auto, self.budget_auto)

    def during(self, stats: RunStats) -> Optional[str]:
        """The measured sentence, the first time the run has committed JUDGED_SHARE of its image,
        if it is going slower than AR; None before, after, when `before` said it, and otherwise.
        Judged once per RunPace."""
        passes = stats.records[1:]  # the prompt's pass commits one token, as AR's does
        if self.judged or self.cost is None or not passes or stats.tokens_committed < JUDGED_SHARE * stats.num_tokens:
            return None
        self.judged = True
        if self.before:
            return None  # said before the run, for certain
        nodes = sum(r.envelope or pass_nodes(self.config) for r in passes) / len(passes)
        ratio = _unless_noise(min(r.forward_time for r in passes) / max(self.cost(1), 1e-12), nodes)
        if ratio is None:
            return None
        tokens = sum(r.committed for r in passes) / len(passes)
        return running_slower_than_ar(self.config, len(passes), tokens, ratio, self.device, self.auto,
                                      self.budget_auto)


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


def device_words(model: ARImageModel) -> str:
    kind = model.device.type
    return "the GPU" if kind == "cuda" else ("the Mac's GPU" if kind == "mps" else "this CPU")


def run_pace(model: ARImageModel, encoding: PromptEncoding, config: SamplerConfig,
             auto: str = AUTO_WORDS, budget_auto: str = BUDGET_AUTO_WORDS) -> RunPace:
    """The RunPace of a run about to start (measuring the curve if needed; not for AR or window="auto")."""
    cost = cost_curve(model, encoding, config) if _judged(config) else None
    return RunPace(config, cost, device_words(model), auto, budget_auto)


def slow_shape_warning(model: ARImageModel, encoding: PromptEncoding, config: SamplerConfig) -> Optional[str]:
    """`slower_than_ar` for a run about to start (measuring the curve if needed)."""
    if not _judged(config) or pass_nodes(config) <= most_tokens_per_pass(config):
        return None  # nothing to measure: a pass of that few tokens costs at most that many passes
    return run_pace(model, encoding, config).before
