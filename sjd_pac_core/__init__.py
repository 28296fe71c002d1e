"""sjd_pac_core: lossless speculative Jacobi decoding (SJD, SJD-PAC) for AR image models.

Pure PyTorch + transformers; no ComfyUI or Gradio import anywhere in this package.

    import sjd_pac_core as sp
    model = sp.load_model("demo")
    result = sp.generate_image(model, "a large orange circle top right on a blue background", seed=0)
    result.images[0].save("out.png"); print(result.stats.summary())
"""

import importlib
from typing import Any, List

from .library_noise import silence_known_noise

silence_known_noise()  # before anything imports transformers (which imports torchao when installed)

# Names are imported on first use (PEP 562), so that `import sjd_pac_core` -- and with it the
# `sjd-pac` command's argument parsing and `--help` -- does not load torch and transformers.
_EXPORTS = {
    "ConfigError": ".config", "SamplerConfig": ".config",
    "GenerationCancelled": ".engine.loop", "Progress": ".engine.loop", "SampleResult": ".engine.loop",
    "sample_tokens": ".engine.loop", "NonFiniteError": ".engine.finite",
    "PassRecord": ".engine.stats", "RunStats": ".engine.stats",
    "ImageResult": ".generate", "generate_image": ".generate",
    "DecoderSession": ".models.base", "TokenModel": ".models.base",
    "CausalLMAdapter": ".models.causal_lm", "NotACausalLMError": ".models.causal_lm",
    "ARImageModel": ".models.image_model", "FamilyDefaults": ".models.image_model",
    "ImageLayout": ".models.image_model", "PromptEncoding": ".models.image_model",
    "ModelLoadError": ".models.loader", "list_model_folders": ".models.loader", "load_model": ".models.loader",
    "memory_plan": ".models.loader", "MemoryPlan": ".models.memory",
    "resolve_device": ".models.loader", "resolve_folder": ".models.loader",
    "SamplingRecipe": ".sampling.recipe", "TokenConstraints": ".sampling.recipe",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:  # a subpackage used as an attribute (sjd_pac_core.engine), as after an eager import
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__version__ = "0.1.0"

__all__ = [
    "ARImageModel",
    "CausalLMAdapter",
    "ConfigError",
    "DecoderSession",
    "FamilyDefaults",
    "GenerationCancelled",
    "ImageLayout",
    "ImageResult",
    "MemoryPlan",
    "ModelLoadError",
    "NonFiniteError",
    "NotACausalLMError",
    "PassRecord",
    "Progress",
    "PromptEncoding",
    "RunStats",
    "SampleResult",
    "SamplerConfig",
    "SamplingRecipe",
    "TokenConstraints",
    "TokenModel",
    "generate_image",
    "list_model_folders",
    "load_model",
    "memory_plan",
    "resolve_device",
    "resolve_folder",
    "sample_tokens",
]
