"""sjd_pac_app: a Gradio page to watch SJD / SJD-PAC accept tokens live (`sjd-pac-app`)."""

import os

# Set before anything can import gradio: the app never phones home.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
