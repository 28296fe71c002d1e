"""SJD-PAC Sampler and SJD-PAC Text to Image: prompt -> image tokens, with live progress."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

import sjd_pac_core as sp
from sjd_pac_core import ConfigError, Progress, SamplerConfig
from sjd_pac_core.config import METHODS, VERIFY_RULES
from sjd_pac_core.models.sizes import known_resolutions

from . import comfy_bridge, speedup
from .datatypes import AR_IMAGE_MODEL, AR_IMAGE_TOKENS, SJD_STATS, ARImageTokens, ModelHandle, SJDStats

log = logging.getLogger("sjd_pac.nodes")

# ComfyUI needs a static list: the union of the resolutions the supported families offer, checked
# against the loaded model at run time ("default" = the family's own default).
RESOLUTIONS = ["default", *known_resolutions()]
METHOD_CHOICES = ["sjd_pac", "sjd", "ar"]
VERIFY_CHOICES = ["rejection", "gumbel"]
SEED_MAX = 2**63 - 1  # batches use seed, seed + 1, ...; torch seeds must stay below 2**64
PROGRESS_EVENT = "sjd_pac.progress"

assert set(METHOD_CHOICES) == set(METHODS) and set(VERIFY_CHOICES) == set(VERIFY_RULES)

# name -> (ComfyUI type, options). One table feeds INPUT_TYPES and VALIDATE_INPUTS.
KNOBS: Dict[str, Tuple[Any, dict]] = {
    "cfg": ("FLOAT", {
        "default": 3.0, "min": 0.0, "max": 30.0, "step": 0.1, "round": 0.01,
        "tooltip": "Classifier-free guidance scale: how strongly the image follows the prompt. 1.0 turns "
                   "guidance off (half the compute); usual 3-5 (demo 3, Lumina-mGPT 3-4, Emu3 3, Janus-Pro 5).",
    }),
    "temperature": ("FLOAT", {
        "default": 1.0, "min": 0.01, "max": 5.0, "step": 0.01,
        "tooltip": "Sampling temperature: below 1 sharper and less varied, above 1 more random. Usual 0.8-1.0. "
                   "For a reproducible picture use verification 'gumbel', not a low temperature.",
    }),
    "top_k": ("INT", {
        "default": 0, "min": 0, "max": 65536, "step": 1,
        "tooltip": "Keep only the k most likely tokens at each position; 0 = off. Lumina-mGPT uses 2000, "
                   "Emu3 2048. Lower values make drafts easier to accept but images blander.",
    }),
    "top_p": ("FLOAT", {
        "default": 1.0, "min": 0.01, "max": 1.0, "step": 0.01,
        "tooltip": "Nucleus sampling: keep the smallest set of tokens whose probability adds up to p; 1.0 = off. "
                   "Usual 0.9-1.0.",
    }),
    "method": (METHOD_CHOICES, {
        "default": "sjd_pac",
        "tooltip": "ar: one token per forward pass (the baseline). sjd: Speculative Jacobi Decoding, verifies "
                   "a window of drafts per pass. sjd_pac: SJD with Adaptive Continuation and Proactive "
                   "Drafting, the fastest. All three are lossless: same distribution of images.",
    }),
    "window": ("INT", {
        "default": 32, "min": 1, "max": 512, "step": 1,
        "tooltip": "Window L: draft tokens verified per forward pass (sjd, sjd_pac). Usual 16-64; larger "
                   "windows cost more per pass on big models. Ignored by ar.",
    }),
    "tree_depth": ("INT", {
        "default": 3, "min": 1, "max": 8, "step": 1,
        "tooltip": "Tree depth D of Proactive Drafting (sjd_pac): the tree branches at the D-1 positions after "
                   "a rejection. 1 turns the tree off; the paper uses 3.",
    }),
    "tree_width": ("INT", {
        "default": 4, "min": 1, "max": 16, "step": 1,
        "tooltip": "Tree width K of Proactive Drafting (sjd_pac): at most K candidate tokens per tree level. "
                   "The paper uses 4; must not exceed top_k.",
    }),
    "verify": (VERIFY_CHOICES, {
        "default": "rejection",
        "tooltip": "rejection: speculative rejection sampling, exact in distribution. gumbel: seed-exact, so "
                   "ar, sjd and sjd_pac give the very same image for the same seed (use it to compare methods).",
    }),
    "batch_size": ("INT", {
        "default": 1, "min": 1, "max": 16, "step": 1,
        "tooltip": "Images per run, sampled one after another with seeds seed, seed+1, ...",
    }),
}

CONFIG_KNOBS = frozenset(KNOBS) - {"batch_size"}

MODEL_INPUT = (AR_IMAGE_MODEL, {"tooltip": "The model from Load AR Image Model."})
PROMPT_INPUT = ("STRING", {
    "multiline": True, "default": "a red circle on a blue background",
    "tooltip": "What to draw. The demo model knows a few words (colours, shapes, textures, backgrounds).",
})
SEED_INPUT = ("INT", {
    "default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True,
    "tooltip": "Random seed. With verification 'gumbel' the same seed gives the same image with every method.",
})


def _check_knob(name: str, value: Any) -> Optional[str]:
    """ComfyUI skips its own range check for inputs VALIDATE_INPUTS names, so do it here."""
    kind, opts = KNOBS[name]
    if isinstance(kind, list):
        if value not in kind:
            return f"{name} must be one of {', '.join(kind)}, got {value!r}."
        return None
    if "min" in opts and value < opts["min"]:
        return f"{name} must be at least {opts['min']}, got {value}; the usual value is {opts['default']}."
    if "max" in opts and value > opts["max"]:
        return f"{name} must be at most {opts['max']}, got {value}; the usual value is {opts['default']}."
    return None


def check_tree_fits_top_k(method: str, tree_depth: int, tree_width: int, top_k: int) -> None:
    """Proactive Drafting draws K distinct candidates, so K must not exceed top-k when both are on."""
    if method == "sjd_pac" and tree_depth > 1 and top_k and tree_width > top_k:
        raise ConfigError(
            f"tree_width (K) = {tree_width} is larger than top_k = {top_k}; lower tree_width to at most "
            f"{top_k} or raise top_k."
        )


def make_config(
    method: str, window: int, tree_depth: int, tree_width: int, verify: str,
    cfg: float, temperature: float, top_k: int, top_p: float,
) -> SamplerConfig:
    """Widget values -> SamplerConfig (top_k 0 and top_p 1.0 mean off); raises ConfigError."""
    check_tree_fits_top_k(method, tree_depth, tree_width, top_k)
    return SamplerConfig(
        method=method, window=int(window), tree_depth=int(tree_depth), tree_width=int(tree_width),
        verify=verify, cfg_scale=float(cfg), temperature=float(temperature),
        top_k=int(top_k) if top_k else None, top_p=float(top_p) if top_p < 1.0 else None,
    )


def validate_knobs(**values: Any) -> Any:
    """True, or one sentence naming the fix (ComfyUI shows it before any model work)."""
    given = {k: v for k, v in values.items() if v is not None}  # linked inputs arrive as None
    for name, value in given.items():
        message = _check_knob(name, value)
        if message:
            return message
    try:
        if CONFIG_KNOBS <= set(given):
            make_config(**{k: given[k] for k in CONFIG_KNOBS})
        elif {"method", "top_k", "tree_depth", "tree_width"} <= set(given):
            check_tree_fits_top_k(given["method"], given["tree_depth"], given["tree_width"], given["top_k"])
    except ConfigError as exc:
        return str(exc)
    return True


class LiveReporter:
    """The per-pass callback: Cancel check, progress bar, live preview, chart events."""

    PREVIEW_EVERY = 4  # passes between previews...
    PREVIEW_MIN_INTERVAL = 0.25  # ...and at least this many seconds (the first and last always)
    EVENT_MIN_INTERVAL = 0.1  # seconds between chart messages (per-pass counts are batched)

    def __init__(self, model: sp.ARImageModel, resolution: Optional[str], node_id: Optional[str],
                 batch_size: int, method: str) -> None:
        self.model = model
        self.resolution = resolution
        self.node_id = None if node_id is None else str(node_id)
        self.batch_size = batch_size
        self.method = method
        self.image = -1
        self.sink: Optional[comfy_bridge.ProgressSink] = None
        self.pending: List[int] = []
        self.last_preview = float("-inf")
        self.last_event = float("-inf")
        self.previews = 0

    def __call__(self, progress: Progress) -> None:
        comfy_bridge.check_interrupted()  # Cancel: raises here, the sampler frees its cache
        record, n = progress.record, progress.num_tokens
        if record.index == 0:
            self.image += 1
        if self.sink is None:
            self.sink = comfy_bridge.ProgressSink(n * self.batch_size, self.node_id)
        now = time.perf_counter()
        done = record.total_committed >= n
        preview = None
        if done or record.index == 0 or (
            record.index % self.PREVIEW_EVERY == 0 and now - self.last_preview >= self.PREVIEW_MIN_INTERVAL
        ):
            preview = self._preview(progress.tokens)
            self.last_preview = now
        self.sink.update(self.image * n + record.total_committed, preview)
        self.pending.append(record.committed)
        if done or now - self.last_event >= self.EVENT_MIN_INTERVAL:
            self._send(progress, done)
            self.last_event = now

    def _preview(self, tokens: torch.Tensor):
        try:
            image = self.model.preview(tokens, self.resolution)
        except Exception:  # a preview must never stop a run
            log.debug("sjd-pac: preview failed", exc_info=True)
            return None
        if image is not None:
            self.previews += 1
        return image

    def _send(self, progress: Progress, done: bool) -> None:
        stats = progress.stats
        comfy_bridge.send_event(PROGRESS_EVENT, {
            "node": self.node_id,
            "method": self.method,
            "image": self.image,
            "batch_size": self.batch_size,
            "reset": self.image == 0 and len(self.pending) == stats.forward_passes,
            "accepted": self.pending,
            "passes": stats.forward_passes,
            "committed": stats.tokens_committed,
            "num_tokens": progress.num_tokens,
            "step_compression": round(stats.step_compression, 4),
            "done": done,
        })
        self.pending = []


def run_sampler(
    handle: ModelHandle, prompt: str, negative_prompt: str, resolution: str, seed: int,
    config: SamplerConfig, batch_size: int, node_id: Optional[str] = None,
) -> Tuple[ARImageTokens, SJDStats]:
    """Sample with live progress; shared by the sampler and the one-node text-to-image."""
    model = handle.get()
    res = None if resolution in (None, "", "default") else resolution
    model.check_resolution(res)  # a clear error before any model work
    reporter = LiveReporter(model, res, node_id, batch_size, config.method)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = sp.generate_image(
                model, prompt, config=config, seed=int(seed), negative_prompt=negative_prompt,
                resolution=res, callback=reporter, batch_size=int(batch_size),
            )
    except BaseException:
        comfy_bridge.soft_empty_cache()  # the loop has freed its KV cache; hand the memory back
        raise
    for w in caught:
        log.warning("sjd-pac: %s", w.message)
    tokens = result.tokens.reshape(batch_size, -1).cpu()
    out = ARImageTokens(tokens=tokens, resolution=result.encoding.resolution, model=handle,
                        seeds=[int(seed) + i for i in range(batch_size)])
    key = (handle.key, prompt, negative_prompt, int(seed), result.encoding.resolution, int(batch_size),
           config.cfg_scale, config.temperature, config.top_k, config.top_p)
    stats = SJDStats(runs=list(result.all_stats), config=config, model_name=handle.name, prompt=prompt,
                     seed=int(seed), resolution=result.encoding.resolution, tokens=tokens, baseline_key=key)
    speedup.record(stats)
    return out, stats


class SJDPACSampler:
    DESCRIPTION = (
        "Samples image tokens with plain AR, SJD or SJD-PAC. All three are lossless (same distribution "
        "as the model's own sampling); SJD-PAC needs the fewest forward passes. Shows progress, a live "
        "preview and a chart of tokens accepted per pass."
    )
    CATEGORY = "sjd-pac"
    RETURN_TYPES = (AR_IMAGE_TOKENS, SJD_STATS)
    RETURN_NAMES = ("tokens", "stats")
    OUTPUT_TOOLTIPS = (
        "The sampled image tokens; connect to Decode AR Image Tokens.",
        "Acceptance statistics of the run; connect to SJD Stats.",
    )
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        k = KNOBS
        return {
            "required": {
                "model": MODEL_INPUT,
                "prompt": PROMPT_INPUT,
                "negative_prompt": ("STRING", {
                    "multiline": True, "default": "",
                    "tooltip": "What to avoid; used as the unconditional prompt of classifier-free guidance "
                               "(needs cfg > 1). Some families (the demo model) ignore it.",
                }),
                "resolution": (RESOLUTIONS, {
                    "default": "default",
                    "tooltip": "Output size (width x height). 'default' takes the model's own; other sizes must be "
                               "ones the loaded model was trained for, else the node names them: demo 64x64, "
                               "Janus-Pro 384x384, Emu3 720x720 832x624 624x832 960x544 544x960, Lumina-mGPT "
                               "every size of its checkpoint's pixel area (e.g. 768x768, 1024x576, 576x1024 "
                               "for -768).",
                }),
                "seed": SEED_INPUT,
                "cfg": k["cfg"], "temperature": k["temperature"], "top_k": k["top_k"], "top_p": k["top_p"],
                "method": k["method"], "window": k["window"], "tree_depth": k["tree_depth"],
                "tree_width": k["tree_width"], "verify": k["verify"], "batch_size": k["batch_size"],
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, method=None, top_k=None, tree_depth=None, tree_width=None):
        # Only the knobs of the cross-knob rule (K <= top-k when the tree is on): ComfyUI shows a
        # failure on every input named here and skips its own min/max check for them, so the
        # other knobs keep ComfyUI's range and choice checks (also before any model work).
        return validate_knobs(method=method, top_k=top_k, tree_depth=tree_depth, tree_width=tree_width)

    def sample(self, model: ModelHandle, prompt: str, negative_prompt: str, resolution: str, seed: int,
               cfg: float, temperature: float, top_k: int, top_p: float, method: str, window: int,
               tree_depth: int, tree_width: int, verify: str, batch_size: int,
               unique_id: Optional[str] = None) -> Tuple[ARImageTokens, SJDStats]:
        config = make_config(method, window, tree_depth, tree_width, verify, cfg, temperature, top_k, top_p)
        return run_sampler(model, prompt, negative_prompt, resolution, seed, config, batch_size, unique_id)


class SJDPACTextToImage:
    DESCRIPTION = (
        "One node from prompt to image with the model's recommended settings (CFG, temperature, top-k, "
        "window) and the chosen method. Use SJD-PAC Sampler for every knob."
    )
    CATEGORY = "sjd-pac"
    RETURN_TYPES = ("IMAGE", SJD_STATS)
    RETURN_NAMES = ("image", "stats")
    OUTPUT_TOOLTIPS = ("The generated image(s).", "Acceptance statistics; connect to SJD Stats.")
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "model": MODEL_INPUT,
                "prompt": PROMPT_INPUT,
                "seed": SEED_INPUT,
                "method": KNOBS["method"],
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def generate(self, model: ModelHandle, prompt: str, seed: int, method: str,
                 unique_id: Optional[str] = None) -> Tuple[torch.Tensor, SJDStats]:
        from .decode import tokens_to_image

        config = model.get().defaults.sampler_config(method=method)
        tokens, stats = run_sampler(model, prompt, "", "default", seed, config, 1, unique_id)
        return tokens_to_image(tokens), stats
