"""MLCommons Chakra's execution-trace schema, as the tables of its field numbers.

Written from Chakra's published ``schema/protobuf/et_def.proto`` (github.com/mlcommons/chakra;
unchanged from 2023-10-10, commit a2b45c1, to 1.0.0 of 2026-05-20): the numbering that Chakra's
GlobalMetadata calls "0.0.4" and "1.0.0", and that its PyTorch converter writes with the version
left empty. The messages are made at run time from these tables with the ``protobuf`` package
(``descriptor_pool``: no generated code, no protoc); ``messages()`` gives their classes.

Chakra's development schemas of 2023 (0.0.1 to 0.0.3, before GlobalMetadata had a version) number
their fields otherwise and are not read (docs/trace-format.md, "Chakra"): emu names the
versions it reads instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from emu.errors import TraceError

PACKAGE = "ChakraProtoMsg"
# GlobalMetadata.version strings of this numbering ("": Chakra's PyTorch converter leaves it empty
# and names its host trace's schema in the attribute "schema")
VERSIONS = ("0.0.4", "1.0.0", "")


class NodeType:
    """et_def.proto's NodeType (its values, as the wire has them)."""

    INVALID = 0
    METADATA = 1
    MEM_LOAD = 2
    MEM_STORE = 3
    COMP = 4
    COMM_SEND = 5
    COMM_RECV = 6
    COMM_COLL = 7


class CommType:
    """et_def.proto's CollectiveCommType."""

    ALL_REDUCE = 0
    REDUCE = 1
    ALL_GATHER = 2
    GATHER = 3
    SCATTER = 4
    BROADCAST = 5
    ALL_TO_ALL = 6
    REDUCE_SCATTER = 7
    REDUCE_SCATTER_BLOCK = 8
    BARRIER = 9


NAMES = {v: k for k, v in vars(CommType).items() if not k.startswith("_")}


@dataclass(frozen=True)
class Field:
    name: str
    number: int
    type: str  # a protobuf scalar type, or the name of a message of this file
    repeated: bool = False
    oneof: bool = False  # a member of the message's one oneof, ``value``


_SCALARS = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
            "sfixed32", "sfixed64", "bool", "string", "bytes")
# AttributeProto's oneof: each scalar, then its list (3 and 4 for double, 5 and 6 for float, ...)
_LISTS = {t: f"{t.capitalize()}List" for t in _SCALARS}
_VALUES = tuple(f for i, t in enumerate(_SCALARS)
                for f in (Field(f"{t}_val", 3 + 2 * i, t, oneof=True),
                          Field(f"{t}_list", 4 + 2 * i, _LISTS[t], oneof=True)))

MESSAGES: dict[str, tuple[Field, ...]] = {
    "AttributeProto": (Field("name", 1, "string"), Field("doc_string", 2, "string"), *_VALUES),
    **{_LISTS[t]: (Field("values", 1, t, repeated=True),) for t in _SCALARS},
    "GlobalMetadata": (Field("version", 1, "string"), Field("attr", 2, "AttributeProto", repeated=True)),
    "IOInfo": (Field("values", 1, "string"), Field("shapes", 2, "string"), Field("types", 3, "string")),
    "Node": (Field("id", 1, "uint64"), Field("name", 2, "string"), Field("type", 3, "int32"),
             Field("ctrl_deps", 4, "uint64", repeated=True), Field("data_deps", 5, "uint64", repeated=True),
             Field("start_time_micros", 6, "uint64"), Field("duration_micros", 7, "uint64"),
             Field("inputs", 8, "IOInfo"), Field("outputs", 9, "IOInfo"),
             Field("attr", 10, "AttributeProto", repeated=True)),
}
# Node.type is the enum NodeType in et_def.proto; an enum travels as an int32 varint, and reading it
# as one keeps values this emu does not know (they are refused by name, not dropped)


@cache
def messages() -> dict[str, Any]:
    """The message classes of the schema, by name (needs the ``protobuf`` package: pip install
    'emu[chakra]')."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        make = message_factory.GetMessageClass  # protobuf 4.22 and later
    except (ImportError, AttributeError):
        raise TraceError("reading or writing Chakra traces needs the protobuf package, 4.22 or later: "
                         "pip install 'protobuf>=4.22' (or the emu[chakra] extra)") from None
    proto = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="emu_chakra_et_def.proto", package=PACKAGE, syntax="proto3")
    for name, fields in MESSAGES.items():
        msg = file.message_type.add(name=name)
        if any(f.oneof for f in fields):
            msg.oneof_decl.add(name="value")
        for f in fields:
            field = msg.field.add(name=f.name, number=f.number,
                                  label=proto.LABEL_REPEATED if f.repeated else proto.LABEL_OPTIONAL)
            if f.type in _SCALARS:
                field.type = getattr(proto, f"TYPE_{f.type.upper()}")
            else:
                field.type = proto.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{f.type}"
            if f.oneof:
                field.oneof_index = 0
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: make(pool.FindMessageTypeByName(f"{PACKAGE}.{name}")) for name in MESSAGES}
