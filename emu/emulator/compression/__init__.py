"""Gradient compressors at their true packed sizes (``compressors``) and the quantizers the switch sums (``in_switch``)."""
