"""SJD-PAC Sampler and SJD-PAC Text to Image: prompt -> image tokens, with live progress."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch

import sjd_pac_core as sp
from sjd_pac_core import ConfigError, Progress, SamplerConfig
from sjd_pac_core.config import MAX_NODE_BUDGET, MAX_TREE_NODES, MAX_WINDOW, METHODS, VERIFY_RULES, tree_node_count
from sjd_pac_core.demo import EXAMPLE_PROMPT
from sjd_pac_core.models.sizes import known_resolutions
from sjd_pac_core.pass_cost import RunPace, run_pace
from sjd_pac_core.sampling.seeds import SEED_MAX
from sjd_pac_core.settings import RECORD_PNG_KEY, config_from_settings, pointless_setting_warnings, run_record
from sjd_pac_core.threads import threads_for, torch_threads

from . import comfy_bridge, speedup
from .datatypes import AR_IMAGE_MODEL, AR_IMAGE_TOKENS, SJD_STATS, ARImageTokens, SJDStats
from .model_cache import ModelHandle
from .decode import DEFAULT_UPSCALE_TO, UPSCALE_INPUTS, tokens_to_image

log = logging.getLogger("sjd_pac.nodes")

# ComfyUI needs a static list: the union of the resolutions the supported families offer, checked
# against the loaded model at run time ("default" = the family's own default).
RESOLUTIONS = ["default", *known_resolutions()]
METHOD_CHOICES = ["sjd_pac", "sjd", "ar"]
VERIFY_CHOICES = ["rejection", "gumbel"]
PROGRESS_EVENT = "sjd_pac.progress"
MODEL_DEFAULT = -1  # a numeric knob at -1 takes the loaded model's recommended value
AUTO_BUDGET = -1  # node_budget at -1 is 'auto' (the model's own is off: 0)

# Widget ranges for D and K chosen so that no combination exceeds the tree budget: every
# (D, K) the widgets allow has at most MAX_TREE_NODES nodes (D = 4, K = 5: 155 nodes).
TREE_DEPTH_MAX = 4
TREE_WIDTH_MAX = max(k for k in range(1, 65) if tree_node_count(TREE_DEPTH_MAX, k) <= MAX_TREE_NODES)

assert set(METHOD_CHOICES) == set(METHODS) and set(VERIFY_CHOICES) == set(VERIFY_RULES)

_FROM_MODEL = "-1 = the loaded model's recommended value"
_BASE = SamplerConfig()  # the library's defaults, which the large families keep (tests check the demo's)

# Widget name (the SamplerConfig field, as on every surface) -> (ComfyUI type, options): INPUT_TYPES.
KNOBS: Dict[str, Tuple[Any, dict]] = {
    "cfg_scale": ("FLOAT", {
        "default": -1.0, "min": -1.0, "max": 30.0, "step": 0.1, "round": 0.01,
        "tooltip": "Classifier-free guidance scale: how strongly the image follows the prompt. 1.0 turns "
                   f"guidance off (half the compute). {_FROM_MODEL}: demo 2, Lumina-mGPT 3, Lumina-mGPT 2.0 4, Emu3 3, "
                   "Janus-Pro 5.",
    }),
    "temperature": ("FLOAT", {
        "default": -1.0, "min": -1.0, "max": 5.0, "step": 0.01,
        "tooltip": "Sampling temperature: below 1 sharper and less varied, above 1 more random. "
                   f"{_FROM_MODEL}: demo 0.8, the others 1.0. For a reproducible picture use verification "
                   "'gumbel', not a low temperature.",
    }),
    "top_k": ("INT", {
        "default": -1, "min": -1, "max": 65536, "step": 1,
        "tooltip": "Keep only the k most likely tokens at each position; 0 = off. "
                   f"{_FROM_MODEL}: Lumina-mGPT 2000, Lumina-mGPT 2.0 4096, Emu3 2048, demo and Janus-Pro off.",
    }),
    "top_p": ("FLOAT", {
        "default": -1.0, "min": -1.0, "max": 1.0, "step": 0.01,
        "tooltip": "Nucleus sampling: keep the smallest set of tokens whose probability adds up to p; "
                   f"1.0 = off. {_FROM_MODEL} (off for every supported family).",
    }),
    "method": (METHOD_CHOICES, {
        "default": "sjd_pac",
        "tooltip": "ar: one token per forward pass (the baseline). sjd: Speculative Jacobi Decoding, verifies "
                   "a window of drafts per pass. sjd_pac: SJD with Adaptive Continuation and Proactive "
                   "Drafting, which needs the fewest forward passes; the speedup on the clock depends on "
                   "the model and hardware (SJD Stats measures it against an ar run). All three are "
                   "lossless: same distribution of images.",
    }),
    "window": ("INT", {
        "default": MODEL_DEFAULT, "min": -1, "max": MAX_WINDOW, "step": 1,
        "tooltip": "Window L: draft tokens verified per forward pass (sjd, sjd_pac). "
                   f"{_FROM_MODEL} (demo 12, the others {_BASE.window}); 0 = auto (chosen every pass from measured "
                   "costs and acceptance). Usual 16-64; L = 1 commits at most 2 tokens per pass. Ignored by ar.",
    }),
    "tree_depth": ("INT", {
        "default": MODEL_DEFAULT, "min": -1, "max": TREE_DEPTH_MAX, "step": 1,
        "tooltip": "Tree depth D of Proactive Drafting (sjd_pac): the tree branches at the D-1 positions after "
                   "a rejection, so its cost grows as K^(D-1). 1 turns the tree off; "
                   f"{_FROM_MODEL} (demo 2, the others {_BASE.tree_depth} as in the paper).",
    }),
    "tree_width": ("INT", {
        "default": MODEL_DEFAULT, "min": -1, "max": TREE_WIDTH_MAX, "step": 1,
        "tooltip": "Tree width K of Proactive Drafting (sjd_pac): at most K candidate tokens per tree level; "
                   f"the cost grows as K^(D-1). {_FROM_MODEL} (demo 4, the others {_BASE.tree_width} as in the "
                   "paper). Candidates beyond top_k can never be accepted (SJD Stats warns).",
    }),
    "verify": (VERIFY_CHOICES, {
        "default": "gumbel",
        "tooltip": "gumbel (default): seed-exact, so ar, sjd and sjd_pac give the very same image for the same "
                   "seed, and it was as fast or faster for every method measured. rejection: the paper's "
                   "speculative rejection sampling (with window 0 = auto its picture also depends on the measured "
                   "speed, so a seed reproduces only the distribution). Both are exact in distribution.",
    }),
    "batch_size": ("INT", {
        "default": 1, "min": 1, "max": 16, "step": 1,
        "tooltip": "Images per run, sampled one after another with seeds seed, seed+1, ...",
    }),
    "node_budget": ("INT", {
        "default": 0, "min": AUTO_BUDGET, "max": MAX_NODE_BUDGET, "step": 1,
        "tooltip": "Node budget B (sjd_pac): every pass drafts within B nodes, its tree and window chosen from the "
                   "run's acceptance; 0 = off, -1 = auto (B from measured pass costs). A GPU pass costs about one "
                   "token's up to ~128 nodes (with CFG each node is two rows), so try 128 with window 0 (auto) or a "
                   "large L, which caps the main chain.",
    }),
    "compile": ("BOOLEAN", {
        "default": False,
        "tooltip": "Compile the forward pass with torch.compile (CUDA graphs on a GPU): faster passes, same "
                   "images. The first run with a model compiles (about 6 s per pass shape on a CPU; a fixed "
                   "window has 2 shapes, window 0 = auto has 4, 8 with a tree), later runs reuse it.",
    }),
}

MODEL_INPUT = (AR_IMAGE_MODEL, {"tooltip": "The model from Load Emu3, Janus, Lumina (SJD-PAC)."})
PROMPT_INPUT = ("STRING", {
    "multiline": True, "default": EXAMPLE_PROMPT,
    "tooltip": "What to draw. The demo model knows 33 words: colours, shapes (circle, square, triangle, "
               "star, diamond, ring), small/medium/large, positions (top, bottom, left, right, center) and "
               "'on a ... background'; one or two objects.",
})
SEED_INPUT = ("INT", {
    "default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True,
    "tooltip": "Random seed. With verification 'gumbel' the same seed gives the same image with every method "
               "and window; with 'rejection' and window 0 (auto), only the same distribution of images.",
})


def _from_widget(value: Any) -> Any:
    """A numeric widget value -> a config_from_settings value (None = the model's own)."""
    return None if value is None or value == MODEL_DEFAULT else value


def budget_setting(node_budget: Any) -> Any:
    """The node_budget widget -> a config_from_settings value: -1 is 'auto' (0 is off there)."""
    return "auto" if node_budget == AUTO_BUDGET else node_budget


def make_config(
    method: str, window: int, tree_depth: int, tree_width: int, verify: str,
    cfg_scale: float, temperature: float, top_k: int, top_p: float, defaults: Optional[sp.FamilyDefaults] = None,
    compile: bool = False, node_budget: int = 0,
) -> SamplerConfig:
    """Widget values -> SamplerConfig through settings.config_from_settings: -1 takes `defaults`
    (the loaded model's), window 0 is 'auto', top_k 0 and top_p 1.0 are off, node_budget 0 is off
    and -1 'auto'; raises ConfigError."""
    return config_from_settings(
        defaults, method=method, verify=verify,
        window="auto" if window == 0 else _from_widget(window),
        tree_depth=_from_widget(tree_depth), tree_width=_from_widget(tree_width),
        cfg_scale=_from_widget(cfg_scale), temperature=_from_widget(temperature),
        top_k=_from_widget(top_k), top_p=_from_widget(top_p), compile=compile,
        node_budget=budget_setting(node_budget),
    )


def widget_problem(method: Any = None, window: Any = None, tree_depth: Any = None, tree_width: Any = None,
                   verify: Any = None, cfg_scale: Any = None, temperature: Any = None, top_k: Any = None,
                   top_p: Any = None, compile: Any = None, node_budget: Any = None) -> Optional[str]:
    """The sentence make_config refuses these widget values with, before any model is loaded, or
    None: the one conversion, with the library's defaults standing in for the model's (-1) and for
    linked inputs (None; both are checked again with the model's own when the node runs). Every
    (D, K) the widgets allow fits the tree budget with any family's defaults, so a stand-in never
    refuses what the model would accept."""
    try:
        make_config(method, window, tree_depth, tree_width, verify, cfg_scale, temperature, top_k, top_p,
                    compile=compile, node_budget=node_budget)
    except ConfigError as exc:
        return str(exc)
    return None


def record_in_pnginfo(extra_pnginfo: Any, node_id: Optional[str], record: Dict[str, Any]) -> None:
    """Add this sampler's run record to ComfyUI's extra_pnginfo, which Save Image writes into the PNG
    (under RECORD_PNG_KEY, keyed by node id: a graph may hold several samplers)."""
    if isinstance(extra_pnginfo, dict):
        entry = extra_pnginfo.get(RECORD_PNG_KEY)
        if not isinstance(entry, dict):
            entry = extra_pnginfo[RECORD_PNG_KEY] = {}
        entry[str(node_id) if node_id is not None else "sampler"] = record


class LiveReporter:
    """The per-pass callback: Cancel check, progress bar, live preview, chart events."""

    # A preview costs a VQ decode: at most one per this many seconds (the first and last always),
    # by the clock and not by pass count, so slow passes still get one each.
    PREVIEW_MIN_INTERVAL = 0.25
    EVENT_MIN_INTERVAL = 0.1  # seconds between chart messages (per-pass counts are batched)

    def __init__(self, model: sp.ARImageModel, resolution: Optional[str], node_id: Optional[str],
                 batch_size: int, config: SamplerConfig) -> None:
        self.model = model
        self.resolution = resolution
        self.node_id = None if node_id is None else str(node_id)
        self.batch_size = batch_size
        self.method = config.method
        self.auto_budget = config.node_budget == "auto"  # the chart says what each pass picked
        self.image = -1
        self.sink: Optional[comfy_bridge.ProgressSink] = None
        self.pending: List[int] = []
        self.last_preview = float("-inf")
        self.last_event = float("-inf")

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
        if done or record.index == 0 or now - self.last_preview >= self.PREVIEW_MIN_INTERVAL:
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
            # node_budget 'auto': the nodes its last pass picked (the envelope counts the root too)
            "budget": progress.record.envelope - 1 if self.auto_budget and progress.record.envelope else None,
            "done": done,
        })
        self.pending = []


def pace_of(model, prompt: str, negative_prompt: str, resolution: Optional[str], config: SamplerConfig) -> RunPace:
    """pass_cost's RunPace for this run: its sentence before the run (the certain case) and, once,
    during it (measured); one that says nothing when the measurement fails (the run then reports
    the problem itself)."""
    try:
        encoding = model.encode_prompt(prompt, negative_prompt, resolution)
        with torch_threads(threads_for(model)):  # timed as the run will run
            return run_pace(model, encoding, config, auto="window 0 (auto)", budget_auto="node_budget -1 (auto)")
    except Exception:
        log.debug("sjd-pac: the pass-cost check failed", exc_info=True)
        return RunPace(config, None)


def run_sampler(
    handle: ModelHandle, prompt: str, negative_prompt: str, resolution: str, seed: int,
    config: SamplerConfig, batch_size: int, node_id: Optional[str] = None, extra_pnginfo: Any = None,
) -> Tuple[ARImageTokens, SJDStats]:
    """Sample with live progress; shared by the sampler and the one-node text-to-image."""
    model = handle.get()
    res = None if resolution in (None, "", "default") else resolution
    model.check_resolution(res)  # a clear error before any model work
    reporter = LiveReporter(model, res, node_id, batch_size, config)
    pace = pace_of(model, prompt, negative_prompt, res, config)
    slow = [pace.before] if pace.before else []
    if slow:  # said before the run, in the console; SJD Stats repeats it
        log.warning("sjd-pac: %s", slow[0])

    def on_pass(progress: Progress) -> None:
        reporter(progress)
        slow_now = pace.during(progress.stats)
        if slow_now:  # measured on the run's first passes: said in the console now, in SJD Stats after
            log.warning("sjd-pac: %s", slow_now)
            slow.append(slow_now)
    try:
        # Small models run fastest on one thread (a busy CPU made the demo 5-7x slower otherwise).
        with warnings.catch_warnings(record=True) as caught, torch_threads(threads_for(model)) as threads:
            warnings.simplefilter("always")
            result = sp.generate_image(
                model, prompt, config=config, seed=seed, negative_prompt=negative_prompt,
                resolution=res, callback=on_pass, batch_size=int(batch_size),
            )
    except BaseException:
        comfy_bridge.soft_empty_cache()  # the loop has freed its KV cache; hand the memory back
        raise
    notes = [str(w.message) for w in caught] + pointless_setting_warnings(config)
    for note in notes:
        log.warning("sjd-pac: %s", note)
    notes += slow
    tokens = result.tokens.reshape(batch_size, -1).cpu()
    out = ARImageTokens(tokens=tokens, resolution=result.encoding.resolution, model=handle, seeds=result.image_seeds)
    key = (handle.key, prompt, negative_prompt, result.seed, result.encoding.resolution, int(batch_size),
           config.cfg_scale, config.temperature, config.top_k, config.top_p)
    cpu_threads = threads if model.device.type == "cpu" else None
    stats = SJDStats(runs=list(result.all_stats), config=config, model_name=handle.name, prompt=prompt,
                     seed=result.seed, resolution=result.encoding.resolution, tokens=tokens, baseline_key=key,
                     threads=cpu_threads, notes=notes)
    speedup.record(stats)
    record_in_pnginfo(extra_pnginfo, node_id, run_record(
        config, prompt=prompt, seed=result.seed, negative_prompt=negative_prompt,
        resolution=result.encoding.resolution, model=handle.name, family=handle.family, batch_size=batch_size,
        device=str(model.device), threads=cpu_threads))
    return out, stats


class SJDPACSampler:
    DESCRIPTION = (
        "Samples image tokens with plain AR, SJD or SJD-PAC. All three are lossless (same distribution "
        "as the model's own sampling); SJD-PAC needs the fewest forward passes. Shows progress, a live "
        "preview and a chart of tokens accepted per pass."
    )
    CATEGORY = "sjd-pac"
    SEARCH_ALIASES = ["speculative decoding", "speculative jacobi decoding", "fast sampler", "lumina", "janus",
                      "emu3", "autoregressive"]
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
                               "(needs cfg_scale > 1). Some families (the demo model) ignore it.",
                }),
                "resolution": (RESOLUTIONS, {
                    "default": "default",
                    "tooltip": "Output size (width x height). 'default' takes the model's own; other sizes must be "
                               "ones the loaded model was trained for, else the node names them: demo 64x64, "
                               "Janus-Pro 384x384, Emu3 720x720 832x624 624x832 960x544 544x960, Lumina-mGPT "
                               "every size of its checkpoint's pixel area (e.g. 768x768, 1024x576, 576x1024 "
                               "for -768), Lumina-mGPT 2.0 every size of 768x768's area, then of 512x512's.",
                }),
                "seed": SEED_INPUT,
                "cfg_scale": k["cfg_scale"], "temperature": k["temperature"], "top_k": k["top_k"], "top_p": k["top_p"],
                "method": k["method"], "window": k["window"], "tree_depth": k["tree_depth"],
                "tree_width": k["tree_width"], "verify": k["verify"], "batch_size": k["batch_size"],
            },
            # optional, at the end: workflows saved before them still load (widgets go by position)
            "optional": {"compile": k["compile"], "node_budget": k["node_budget"]},
            "hidden": {"unique_id": "UNIQUE_ID", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    # ComfyUI's own check of an input is its widget range, and -1 (the model's value) leaves gaps
    # inside it that the sampler refuses (temperature 0, top_p 0, D or K 0), and two rules tie
    # knobs together (a node budget needs sjd_pac's tree; 'auto' cannot be compiled). Those knobs
    # are named here: ComfyUI then leaves them to this check (the one conversion, so the sentence is
    # the CLI's and the app's) and refuses the prompt before anything runs, the node outlined in
    # red. It repeats a refusal for every input named; the web extension shows it once
    # (sjd_pac_errors.js). The other knobs keep ComfyUI's range and list checks.
    @classmethod
    def VALIDATE_INPUTS(cls, method: Any = None, tree_depth: Any = None, tree_width: Any = None,
                        cfg_scale: Any = None, temperature: Any = None, top_p: Any = None, compile: Any = None,
                        node_budget: Any = None):
        return widget_problem(method=method, tree_depth=tree_depth, tree_width=tree_width, cfg_scale=cfg_scale,
                              temperature=temperature, top_p=top_p, compile=compile, node_budget=node_budget) or True

    def sample(self, model: ModelHandle, prompt: str, negative_prompt: str, resolution: str, seed: int,
               cfg_scale: float, temperature: float, top_k: int, top_p: float, method: str, window: int,
               tree_depth: int, tree_width: int, verify: str, batch_size: int, compile: bool = False,
               node_budget: int = 0, unique_id: Optional[str] = None,
               extra_pnginfo: Any = None) -> Tuple[ARImageTokens, SJDStats]:
        config = make_config(method, window, tree_depth, tree_width, verify, cfg_scale, temperature, top_k, top_p,
                             defaults=model.get().defaults, compile=compile, node_budget=node_budget)
        return run_sampler(model, prompt, negative_prompt, resolution, seed, config, batch_size, unique_id,
                           extra_pnginfo)


class SJDPACTextToImage:
    DESCRIPTION = (
        "One node from prompt to image with the model's recommended settings (CFG, temperature, top-k, "
        "window) and the chosen method. Use SJD-PAC Sampler for every knob."
    )
    CATEGORY = "sjd-pac"
    SEARCH_ALIASES = ["speculative decoding", "fast sampler", "text to image", "lumina", "janus", "emu3",
                      "autoregressive"]
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
                "upscale_to": UPSCALE_INPUTS["upscale_to"],
                "upscale_method": UPSCALE_INPUTS["upscale_method"],
            },
            "optional": {"node_budget": KNOBS["node_budget"]},  # optional, at the end: older workflows load
            "hidden": {"unique_id": "UNIQUE_ID", "extra_pnginfo": "EXTRA_PNGINFO"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, method: Any = None, node_budget: Any = None):
        return widget_problem(method=method, node_budget=node_budget) or True  # as the sampler's

    def generate(self, model: ModelHandle, prompt: str, seed: int, method: str,
                 upscale_to: int = DEFAULT_UPSCALE_TO, upscale_method: str = "nearest", node_budget: int = 0,
                 unique_id: Optional[str] = None, extra_pnginfo: Any = None) -> Tuple[torch.Tensor, SJDStats]:
        config = config_from_settings(model.get().defaults, method=method, node_budget=budget_setting(node_budget))
        tokens, stats = run_sampler(model, prompt, "", "default", seed, config, 1, unique_id, extra_pnginfo)
        return tokens_to_image(tokens, upscale_to, upscale_method), stats
