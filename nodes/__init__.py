"""ComfyUI nodes of sjd-pac (classic NODE_CLASS_MAPPINGS API).

Plain Python: nothing here imports ComfyUI; every ComfyUI call lives in comfy_bridge.
Always import these modules relatively: ComfyUI has a top-level module called `nodes` too.
"""

from .decode import DecodeARImageTokens
from .loader import LoadARImageModel
from .sampler import SJDPACSampler, SJDPACTextToImage
from .stats import SJDStatsNode

NODE_CLASS_MAPPINGS = {
    "LoadARImageModel": LoadARImageModel,
    "SJDPACSampler": SJDPACSampler,
    "DecodeARImageTokens": DecodeARImageTokens,
    "SJDStats": SJDStatsNode,
    "SJDPACTextToImage": SJDPACTextToImage,
}

# Every display name contains "SJD": ComfyUI's node search looks at the class and display names only.
NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadARImageModel": "Load AR Image Model (SJD-PAC)",
    "SJDPACSampler": "SJD-PAC Sampler",
    "DecodeARImageTokens": "Decode AR Image Tokens (SJD-PAC)",
    "SJDStats": "SJD Stats",
    "SJDPACTextToImage": "SJD-PAC Text to Image",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
