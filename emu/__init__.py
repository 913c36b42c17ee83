"""emu: emulate distributed training networks on one machine."""
__version__ = "0.1.0"
