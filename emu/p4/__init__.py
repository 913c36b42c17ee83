"""The P4_16 (v1model) program of the aggregation protocol and its BMv2 fabric.

Filled by the P4 issue; it may import ``emu.emulator``.
"""
