"""The bundled demo text-to-image model: procedural data, a VQ tokenizer and a small transformers LM.

    from sjd_pac_core.demo.model import load_demo
    demo = load_demo()   # LM + VQ + vocabulary from sjd_pac_core/demo/weights/

Rebuild from scratch with ``python -m sjd_pac_core.demo.train``; measure how a speculative
sampler sees it with ``python -m sjd_pac_core.demo.calibrate``.
"""

# The prompt the README, the app, the ComfyUI nodes and the demo workflows start with: chosen with
# the strict check (`python -m sjd_pac_core.demo.quality --prompts ...`) on held-out seeds.
EXAMPLE_PROMPT = "a large orange circle top right on a blue background"
