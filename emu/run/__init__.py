"""emu run: real ranks of an unmodified script inside a large emulated job (docs/run.md).

This package may import torch (the real ranks need it); replay stays torch-free.
"""
