"""ComfyUI entry point of sjd-pac (custom_nodes/sjd-pac/__init__.py).

Importing this file never requires ComfyUI: ComfyUI's modules are touched only through
nodes/comfy_bridge.py, and only when ComfyUI is running. `import sjd_pac_core` never imports it.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if importlib.util.find_spec("sjd_pac_core") is None:  # a plain clone in custom_nodes: append, never shadow
    sys.path.append(_HERE)

WEB_DIRECTORY = "./web"

if __package__:  # loaded as a package, as ComfyUI's custom-node loader does
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402
    from .nodes import comfy_bridge as _comfy_bridge  # noqa: E402

    from .nodes.loader import resolutions_for_choice as _resolutions_for_choice  # noqa: E402

    _comfy_bridge.register_model_folder()  # models/autoregressive; a no-op outside ComfyUI
    _comfy_bridge.register_routes(_resolutions_for_choice)  # the sampler's resolution list (web/)
    _comfy_bridge.order_workflow_templates(os.path.basename(_HERE))  # template browser: 1, 2, 3, ...
else:
    # Imported as a plain module: pytest does this to the repository root of a clone whose folder
    # name is not a Python identifier (e.g. "sjd-pac-main"). There is nothing to register then.
    NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = {}, {}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
