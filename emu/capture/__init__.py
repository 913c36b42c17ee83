"""Capturing what a data-parallel PyTorch run does, as an emu trace.

Three ways in: run a built-in workload (``capture_model``), run a user's
unmodified script (``capture_script``), or import Kineto traces a user already has
(``import_kineto``). torch is imported only in the processes that train.
"""

from emu.capture.merge import import_kineto, merge_ranks
from emu.capture.run import MODELS, CaptureConfig, capture_model, capture_script

__all__ = ["MODELS", "CaptureConfig", "capture_model", "capture_script", "import_kineto", "merge_ranks"]
