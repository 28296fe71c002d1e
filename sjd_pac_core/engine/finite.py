"""Non-finite probabilities: found on the device inside a pass's one host sync, explained after.

A NaN anywhere in a row of logits (or a +inf, or a scale that overflows float32) makes softmax
return NaN for the whole row, and every rule then draws the same token there: token 0 under
Gumbel, the last id under rejection, whatever the constraints allow. `first_non_finite` is a
device tensor that joins the decisions the pass already moves to the host; only a run that
found one pays for `non_finite_error`, which looks at the row again to name the likely cause.
"""

from __future__ import annotations

import torch

from ..sampling.recipe import SamplingRecipe, classifier_free_guidance


class NonFiniteError(ValueError):
    """The sampler's probabilities became NaN or infinite; the message names the image token
    and the likely cause (the model's weights or config, or a sampling setting)."""

    def __init__(self, position: int, num_tokens: int, cause: str, where: str = "") -> None:
        self.position, self.num_tokens, self.cause, self.where = position, num_tokens, cause, where
        super().__init__(
            f"Sampling stopped at image token {position} of {num_tokens}{where}: its probabilities are NaN or "
            f"infinite, so no token can be drawn there; the likely cause is {cause}."
        )

    def __reduce__(self):  # picklable with its fields (a batch worker sends it to its driver)
        return type(self), (self.position, self.num_tokens, self.cause, self.where)

    def on_grid(self, rows: int, row_length: int) -> "NonFiniteError":
        """The same error with the token's row and column in an image of `rows` rows of
        `row_length` tokens (a row's end-of-line token included)."""
        if self.position >= rows * row_length:
            return NonFiniteError(self.position, self.num_tokens, self.cause, " (after the last row)")
        row, col = divmod(self.position, row_length)
        return NonFiniteError(self.position, self.num_tokens, self.cause, f" (row {row}, column {col})")


def non_finite_rows(p: torch.Tensor) -> torch.Tensor:
    """bool [S]: the rows of p [S, V] (probabilities) that hold a NaN or inf. One reduction: a
    row's sum is non-finite exactly when an entry is (entries are at most 1, so finite ones
    cannot overflow), where isfinite would write and reduce a whole [S, V] mask."""
    return ~torch.isfinite(p.sum(-1))


def first_non_finite(p: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """long [1] on p's device: the smallest position whose row of p [S, V] holds a NaN or inf,
    or -1. No host sync: it travels with the pass's decisions."""
    beyond = torch.iinfo(torch.long).max
    at = torch.where(non_finite_rows(p), positions, beyond).min()
    return torch.where(at == beyond, -1, at).reshape(1)


def non_finite_row(p: torch.Tensor, positions: torch.Tensor, position: int) -> int:
    """The first row of p at `position` that is not finite (host reads: the run is ending)."""
    bad = non_finite_rows(p) & (positions == position)
    return int(bad.nonzero()[0, 0])


def likely_cause(logits: torch.Tensor, allowed: torch.Tensor, recipe: SamplingRecipe) -> str:
    """Which step of the recipe made a row non-finite, as a clause naming the fix.

    logits: [B, V] the model's raw logits for the row (B = 2 with CFG); allowed: bool [V], the
    tokens the position may take (the only ones the recipe keeps)."""
    raw = logits.float()[:, allowed]
    if bool(torch.isnan(raw).any() | torch.isposinf(raw).any() | torch.isneginf(raw).all(-1).any()):
        return ("the model itself: its logits are NaN or infinite there, from an overflowing or damaged weight "
                "(load it with check_finite=True to look for NaN/inf weights), a bad rms_norm_eps or layer-norm "
                "epsilon in config.json, or a dtype too narrow for it (try fp32 or bf16)")
    guided = classifier_free_guidance(raw.unsqueeze(1), recipe.cfg_scale)[0]
    if not bool(torch.isfinite(guided).all()):
        return (f"the CFG scale {recipe.cfg_scale:g}: the guided logits overflow float32 (or meet -inf in both "
                "prompts' logits); lower the CFG scale (1-10 is usual)")
    if not bool(torch.isfinite(guided / recipe.temperature).all()):
        return (f"the temperature {recipe.temperature:g}: dividing the logits by it overflows float32; raise the "
                "temperature (1.0 is the model's own distribution)")
    if recipe.top_p is not None:
        return f"the top-p {recipe.top_p:g}: it keeps no token in float32; raise top-p or turn it off"
    return (f"the sampling settings (CFG {recipe.cfg_scale:g}, temperature {recipe.temperature:g}, top-k "
            f"{recipe.top_k}): together they leave no finite probability; try the model's defaults")


def non_finite_error(position: int, num_tokens: int, logits: torch.Tensor, allowed: torch.Tensor,
                     recipe: SamplingRecipe) -> NonFiniteError:
    """The error for a non-finite row at image token `position` (see likely_cause)."""
    return NonFiniteError(position, num_tokens, likely_cause(logits, allowed, recipe))
