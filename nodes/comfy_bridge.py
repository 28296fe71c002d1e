"""Every call into ComfyUI goes through this module, and only this module.

ComfyUI's modules (folder_paths, comfy.utils, comfy.model_management, server) are imported lazily
inside the functions, and only when ComfyUI is actually running (it has already imported them), so
the node classes work as plain Python in CI and in scripts.

Tests (and other hosts) replace the ComfyUI side by injecting plain callables into `hooks`; an
injected callable always wins over ComfyUI:

    hooks.progress(value, total, preview_image_or_None)   # progress bar + live preview
    hooks.interrupt()                                      # raise to cancel (called every pass)
    hooks.event(name, data)                                # front-end message ("sjd_pac.progress")
    hooks.model_roots()                                    # folders holding model sub-folders
"""

from __future__ import annotations

import importlib
import logging
import re
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import torch

log = logging.getLogger("sjd_pac.nodes")

MODEL_FOLDER_NAME = "autoregressive"  # models/autoregressive/<checkpoint folder>/config.json
PREVIEW_MAX_SIZE = 512  # longest side of the live preview sent to the browser


@dataclass
class Hooks:
    """Injected replacements for the ComfyUI calls (None = use ComfyUI when it runs, else no-op)."""

    progress: Optional[Callable[[int, int, Any], None]] = None
    interrupt: Optional[Callable[[], None]] = None
    event: Optional[Callable[[str, dict], None]] = None
    model_roots: Optional[Callable[[], List[str]]] = None


hooks = Hooks()


def reset_hooks() -> None:
    """Forget every injected callable (tests call this in teardown)."""
    global hooks
    hooks = Hooks()


# --- is ComfyUI here? -----------------------------------------------------------------------------
def in_comfyui() -> bool:
    """True inside a running ComfyUI (it imports these modules before loading custom nodes)."""
    return "folder_paths" in sys.modules and "comfy.model_management" in sys.modules


def _comfy(module: str):
    """A ComfyUI module, or None outside ComfyUI (never imported from scratch here)."""
    if not in_comfyui():
        return None
    try:
        return importlib.import_module(module)
    except Exception:  # a ComfyUI too old or too new for this call: degrade to no-op
        log.debug("sjd-pac: ComfyUI module %s is not available", module, exc_info=True)
        return None


# --- model folders --------------------------------------------------------------------------------
def register_model_folder() -> None:
    """Register models/autoregressive with folder_paths (extra_model_paths.yaml entries are kept)."""
    folder_paths = _comfy("folder_paths")
    if folder_paths is None:
        return
    default = os.path.join(folder_paths.models_dir, MODEL_FOLDER_NAME)
    os.makedirs(default, exist_ok=True)
    folder_paths.add_model_folder_path(MODEL_FOLDER_NAME, default, is_default=True)


def model_roots() -> List[str]:
    """Folders whose sub-folders are checkpoints: ComfyUI's 'autoregressive' paths, or injected."""
    if hooks.model_roots is not None:
        return list(hooks.model_roots())
    folder_paths = _comfy("folder_paths")
    if folder_paths is None:
        env = os.environ.get("SJD_PAC_MODEL_DIRS", "")
        return [p for p in env.split(os.pathsep) if p]
    try:
        return list(folder_paths.get_folder_paths(MODEL_FOLDER_NAME))
    except KeyError:  # register_model_folder has not run
        return []


# --- server route: the sizes of a model folder, for the sampler's resolution list ------------------
RESOLUTIONS_ROUTE = "/sjd_pac/resolutions"  # GET ?model=<loader choice> -> JSON (nodes.loader)


def copy_folder(function: object) -> str:
    """The custom_nodes folder of the copy of the pack that defined `function` ("" if unknown):
    ComfyUI 0.3.64 imports a pack under its folder's path (/.../custom_nodes/sjd-pac-main.nodes.
    comfy_bridge), other loaders under a dotted name (custom_nodes.sjd-pac.nodes.comfy_bridge)."""
    module = str(getattr(function, "__module__", "") or "")
    if ".nodes." not in module:
        return ""
    package = module.rsplit(".nodes.", 1)[0]
    return re.split(r"[\\/]", package)[-1] if re.search(r"[\\/]", package) else package.split(".")[-1]


def two_copies_message(first: str, this: str) -> str:
    """What a second copy of the pack says as it loads: which copies, which one runs, the fix."""
    if first and this and first != this:
        return (f"two copies of the pack are installed (custom_nodes/{first} and custom_nodes/{this}); ComfyUI "
                f"runs the nodes of {this}, the one it loaded last, so delete the other folder and restart ComfyUI.")
    return ("another copy of the pack is installed in custom_nodes and ComfyUI runs the nodes of the one it "
            "loaded last, so delete the other copy's folder and restart ComfyUI.")


def register_routes(resolutions_for: Callable[[str], dict]) -> bool:
    """Add RESOLUTIONS_ROUTE to ComfyUI's server once per process (a no-op outside ComfyUI);
    True when it is served.
    The web extension asks it for the loader's model and narrows the sampler's resolution list."""
    server = _comfy("server")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    routes = getattr(instance, "routes", None)
    if routes is None:
        return False

    async def resolutions(request):
        from aiohttp import web  # ComfyUI's web server

        return web.json_response(resolutions_for(request.rel_url.query.get("model", "")))

    # Two copies of the pack (a clone next to a Manager install) each load: the first one's route
    # serves both (aiohttp refuses a second GET on one path and ComfyUI would not start).
    first = next((route for route in routes if getattr(route, "path", None) == RESOLUTIONS_ROUTE), None)
    if first is not None:
        log.warning("sjd-pac: %s", two_copies_message(copy_folder(getattr(first, "handler", None)),
                                                      copy_folder(resolutions)))
        return True
    try:
        routes.get(RESOLUTIONS_ROUTE)(resolutions)
    except Exception:  # a ComfyUI whose server differs: the list then stays the full one
        log.debug("sjd-pac: could not add %s", RESOLUTIONS_ROUTE, exc_info=True)
        return False
    return True


# --- devices and memory ---------------------------------------------------------------------------
def choose_device(choice: str) -> str:
    """'auto' / 'gpu' / 'cpu' -> a device string for load_model; respects ComfyUI's --cpu."""
    if choice == "cpu":
        return "cpu"
    mm = _comfy("comfy.model_management")
    if mm is not None:
        device = mm.get_torch_device()
        if choice == "gpu" and device.type == "cpu":
            raise ValueError(
                "ComfyUI runs on the CPU (started with --cpu or without a GPU); set device to auto or cpu."
            )
        return str(device)
    if choice == "gpu":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        raise ValueError("No GPU is available to PyTorch here; set device to auto or cpu.")
    return "auto"


def soft_empty_cache() -> None:
    mm = _comfy("comfy.model_management")
    if mm is not None:
        mm.soft_empty_cache()
    elif torch.cuda.is_available():
        torch.cuda.empty_cache()


def free_memory_for(num_bytes: int, device: str) -> None:
    """Ask ComfyUI to make room on `device` (unloading its own models) before we load weights."""
    mm = _comfy("comfy.model_management")
    if mm is None or not device or device == "cpu" or num_bytes <= 0:
        return
    try:
        mm.free_memory(num_bytes, torch.device(device))
    except Exception:
        log.warning("sjd-pac: ComfyUI could not free memory before loading", exc_info=True)


_hook_lock = threading.Lock()
_hook_installed = False


def install_free_memory_hook(release: Callable[[torch.device], object]) -> bool:
    """Call release(device) when ComfyUI frees memory on a GPU and it was not enough.

    ComfyUI only manages the models it loaded itself (through ModelPatcher). Ours are plain
    PyTorch modules, so we wrap comfy.model_management.free_memory: every path that frees memory
    (loading another model, the "Unload models" button / POST /free, unload_all_models) goes
    through it. After ComfyUI has unloaded its own models, if the device still lacks the memory
    asked for, `release` moves ours off that device. Installed once; returns whether it is in place.
    """
    global _hook_installed
    mm = _comfy("comfy.model_management")
    if mm is None:
        return False
    with _hook_lock:
        if _hook_installed:
            return True
        original = mm.free_memory

        def free_memory(memory_required, device, *args, **kwargs):
            result = original(memory_required, device, *args, **kwargs)
            try:
                dev = torch.device(device)
                if dev.type != "cpu":
                    free = mm.get_free_memory(dev)
                    if free < memory_required:
                        release(dev)
            except Exception:
                log.warning("sjd-pac: releasing AR image models failed", exc_info=True)
            return result

        free_memory.__wrapped__ = original  # type: ignore[attr-defined]
        mm.free_memory = free_memory
        _hook_installed = True
        return True


# --- progress, preview, cancel, front-end events ----------------------------------------------------
class ProgressSink:
    """One node run's progress bar: committed tokens out of all tokens of the batch."""

    def __init__(self, total: int, node_id: Optional[str]) -> None:
        self.total = max(1, int(total))
        self.node_id = node_id
        self._bar = None
        if hooks.progress is None:
            utils = _comfy("comfy.utils")
            if utils is not None:
                self._bar = utils.ProgressBar(self.total, node_id=node_id)

    def update(self, value: int, preview=None) -> None:
        """Advance to `value`; `preview` is a PIL image shown on the node (or None)."""
        value = min(int(value), self.total)
        if hooks.progress is not None:
            hooks.progress(value, self.total, preview)
        elif self._bar is not None:
            payload = ("JPEG", preview.convert("RGB"), PREVIEW_MAX_SIZE) if preview is not None else None
            self._bar.update_absolute(value, self.total, payload)


def check_interrupted() -> None:
    """Raise if the user pressed Cancel (ComfyUI's InterruptProcessingException) or a hook says so."""
    if hooks.interrupt is not None:
        hooks.interrupt()
        return
    mm = _comfy("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()


def send_event(name: str, data: dict) -> None:
    """Send a message to the browser (the web/ extension); skipped when there is no server."""
    if hooks.event is not None:
        hooks.event(name, data)
        return
    server = _comfy("server")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    if instance is None:
        return
    try:
        instance.send_sync(name, data, getattr(instance, "client_id", None))
    except Exception:
        log.debug("sjd-pac: could not send %s", name, exc_info=True)



# --- template browser order -----------------------------------------------------------------------
TEMPLATE_LISTING_PATHS = ("/workflow_templates", "/api/workflow_templates")


def sort_template_listing(listing: Any, pack_folder: str) -> Any:
    """The /workflow_templates answer with this pack's workflow names sorted (others untouched)."""
    if isinstance(listing, dict) and isinstance(listing.get(pack_folder), list):
        listing = {**listing, pack_folder: sorted(listing[pack_folder])}
    return listing


def order_workflow_templates(pack_folder: str) -> bool:
    """Make ComfyUI list this pack's workflows in file-name order (1 - demo, 2 - comparison, ...).

    ComfyUI (0.3.64) lists them in directory order, which the file system decides, and its front
    end shows them as listed; a small middleware sorts our own entry. Returns whether it is in place.
    """
    server = _comfy("server")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    app = getattr(instance, "app", None)
    if app is None or getattr(app, "frozen", True):
        return False
    try:
        import json

        from aiohttp import web
    except ImportError:
        return False

    @web.middleware
    async def sorted_templates(request, handler):
        response = await handler(request)
        if request.path in TEMPLATE_LISTING_PATHS and getattr(response, "content_type", "") == "application/json":
            try:
                listing = json.loads(response.body)
            except (TypeError, ValueError):
                return response
            return web.json_response(sort_template_listing(listing, pack_folder))
        return response

    try:
        app.middlewares.append(sorted_templates)
    except RuntimeError:  # the app has started: its middlewares are frozen
        return False
    return True
