"""Start the app: `sjd-pac-app` (or `python -m sjd_pac_app`); see docs/app.md."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported anywhere

from .runner import DEFAULT_MODELS_DIR, DEMO


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="sjd-pac-app",
        description="Web page to generate images with AR / SJD / SJD-PAC and watch acceptance live.",
    )
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 opens it to the network)")
    ap.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    ap.add_argument("--model", default=DEMO,
                    help="model to load at start: 'demo' (bundled) or a checkpoint folder (default demo)")
    ap.add_argument("--models-dir", default=None,
                    help=f"folder whose sub-folders are offered in the model list (default ./{DEFAULT_MODELS_DIR} "
                         "if it exists)")
    ap.add_argument("--device", default="auto", help="auto (GPU if there is one), cuda, cuda:1, mps or cpu")
    ap.add_argument("--dtype", default="auto", help="auto, bf16, fp16 or fp32")
    ap.add_argument("--quantize", default="none", choices=["none", "int8", "4bit", "auto"],
                    help="weight-only quantization of the model's transformer layers (auto: the most precise "
                         "that fits the device)")
    ap.add_argument("--check-finite", action="store_true",
                    help="look for NaN or infinite values in every weight after loading (done anyway for models "
                    "of up to 2e9 parameters; larger ones take a while)")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between live updates (default 0.1)")
    return ap.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        from .app import SjdPacApp  # imports gradio (after the env var above)
        from .layout import launch_kwargs
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in ("gradio", "gradio_client"):
            raise
        print("sjd-pac-app needs Gradio, which is not installed; run: pip install 'sjd-pac[app]'",
              file=sys.stderr)
        return 2
    from .runner import ModelManager

    models_dir = args.models_dir
    if models_dir is None and DEFAULT_MODELS_DIR.is_dir():
        models_dir = str(DEFAULT_MODELS_DIR)
    if models_dir is not None and not Path(models_dir).expanduser().is_dir():
        print(f"sjd-pac-app: --models-dir {models_dir} is not a folder; pass the folder that holds "
              "your checkpoint folders.", file=sys.stderr)
        return 2

    app = SjdPacApp(ModelManager(models_dir, device=args.device, dtype=args.dtype,
                                      quantize=args.quantize, check_finite=args.check_finite), args.model,
                    interval=args.interval)
    say(f"loading the model {args.model!r} (device {args.device}) …")
    app.preload()
    if app.startup_error:  # keep serving: the page shows the error and lets you pick another model
        print(f"sjd-pac-app: {app.startup_error}", file=sys.stderr)
    say("building the page …")
    blocks = app.build()
    say(f"starting the server on {args.host}:{args.port} …")
    blocks.launch(server_name=args.host, server_port=args.port, inbrowser=False, prevent_thread_lock=True,
                  **launch_kwargs())
    where = "this machine only" if args.host in ("127.0.0.1", "localhost") else "reachable from the network"
    say(f"ready: open {blocks.local_url} ({where}); press Ctrl+C to stop.")
    try:
        blocks.block_thread()
    except KeyboardInterrupt:
        pass
    return 0


def say(message: str) -> None:
    """Start-up progress on stdout, so a slow start never looks like a hang."""
    print(f"sjd-pac-app: {message}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
