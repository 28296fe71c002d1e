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

# ComfyUI's node search (its front end 1.27, with ComfyUI 0.3.64) looks at the class name and the
# display name only, fuzzily and near their start: every display name contains "SJD", and the words
# people search for (speculative, fast sampler, the families) come early in the names of the nodes
# they mean. Newer front ends also read each class's SEARCH_ALIASES.
NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadARImageModel": "Load Emu3, Janus, Lumina (SJD-PAC)",
    "SJDPACSampler": "SJD-PAC Sampler (fast, speculative)",
    "DecodeARImageTokens": "Decode AR Image Tokens (SJD-PAC)",
    "SJDStats": "SJD Stats (speculative decoding)",
    "SJDPACTextToImage": "SJD-PAC Text to Image (speculative)",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
