"""The locality curve of the demo model, measured by the demo's calibration tool: how far a
changed token reaches (mean total variation of p_{i+d} after changing the token at i), on the
model's own AR samples. The benchmark draws it beside its tables."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from ..models.image_model import ARImageModel


def measure_locality(model: ARImageModel, samples: int = 4, perturb: int = 16, seed: int = 0,
                     max_distance: int = 32) -> Optional[Dict[str, object]]:
    """{"tv": the curve for d = 1..max_distance, "row_length", "entropy_nats", ...} for the demo
    model (sjd_pac_core.demo.tools.calibrate); None for other families."""
    demo = getattr(model, "demo", None)
    if demo is None:
        return None
    from ..demo.model import reference_ar_sample
    from ..demo.tools.calibrate import CAPTIONS, entropy_at_t1, locality_curve

    captions = (CAPTIONS * samples)[:samples]
    with torch.no_grad():
        tokens = reference_ar_sample(demo, captions, seed=seed)
    entropy, _, _ = entropy_at_t1(demo, captions, tokens)
    tv = locality_curve(demo, captions, tokens, perturb=perturb, seed=seed, max_distance=max_distance)
    return {"tv": [round(x, 4) for x in tv], "row_length": demo.vocab.row_length, "samples": samples,
            "perturb": perturb, "entropy_nats": entropy, "source": "sjd_pac_core.demo.tools.calibrate"}
