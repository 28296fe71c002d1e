"""The demo model's tools, apart from the runtime: the procedural data (data.py), training
(train.py, vq_training.py), the picture-quality check (quality.py) and calibration
(calibrate.py). Each tool is a command: ``python -m sjd_pac_core.demo.tools.<name> --help``.
"""
