"""The fake-worker runtime that replays traces through a fabric, and its reports.

Filled by the replay issue; it may import ``emu.traces`` and ``emu.emulator``.
"""
