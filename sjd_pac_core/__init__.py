"""sjd_pac_core: lossless speculative Jacobi decoding (SJD, SJD-PAC) for AR image models.

Pure PyTorch + transformers; no ComfyUI or Gradio import anywhere in this package.

    import sjd_pac_core as sp
    model = sp.load_model("demo")
    result = sp.generate_image(model, "a red circle on a blue background", seed=0)
    result.images[0].save("out.png"); print(result.stats.summary())
"""

from .config import ConfigError, SamplerConfig
from .engine.loop import GenerationCancelled, Progress, SampleResult, sample_tokens
from .engine.stats import PassRecord, RunStats
from .generate import ImageResult, generate_image
from .models.base import DecoderSession, TokenModel
from .models.causal_lm import CausalLMAdapter, NotACausalLMError
from .models.image_model import ARImageModel, FamilyDefaults, ImageLayout, PromptEncoding
from .models.loader import ModelLoadError, list_model_folders, load_model, resolve_device, resolve_folder
from .sampling.recipe import SamplingRecipe, TokenConstraints

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
    "ModelLoadError",
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
    "resolve_device",
    "resolve_folder",
    "sample_tokens",
]
