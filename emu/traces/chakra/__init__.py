"""MLCommons Chakra execution traces: read into emu traces, and emu traces written as them
(docs/trace-format.md, "Chakra"). Needs the ``protobuf`` package (the ``chakra`` extra)."""

from emu.traces.chakra.read import import_chakra, is_chakra, read_et

__all__ = ["import_chakra", "is_chakra", "read_et"]
