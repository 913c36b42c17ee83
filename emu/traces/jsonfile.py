"""Reading a JSON document that may be gzip-compressed, with bounded size and clear errors.

Shared by emu traces and the Kineto files that capture imports; the caller names
the error class and what the file should have been. Every resource a hostile or
corrupted file could exhaust is bounded before Python's parser sees it: bytes on
disk, bytes after decompression (a gzip bomb), nesting depth (the C parser
recurses, so 100,000 brackets would be a RecursionError) and the digits of an
integer (converting a long one is quadratic, and Python 3.11+ refuses them with a
bare ValueError).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from pathlib import Path
from typing import Any

from emu.errors import EmuError

# Far above any real trace (emu traces nest 9 deep, Kineto traces 7) and far below
# the interpreter's recursion limit, so that no later repr() or walk can hit it.
MAX_JSON_DEPTH = 64
# 2**128 has 39 digits; real traces hold at most 64-bit values (20 digits).
MAX_INT_DIGITS = 40

# Once escaped backslashes and quotes are gone, deleting every byte but these leaves
# a JSON text as strings without escapes, and brackets.
_NOT_SKELETON = bytes(b for b in range(256) if b not in b'"[]{}')
_STRING = re.compile(rb'"[^"]*"')
_PAIR = re.compile(rb"\[\]|\{\}")


class _LongInt(Exception):
    """Raised from inside the parser; carries the digits' count out of it."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInt(len(text.lstrip("-")))
    return int(text)


def json_depth_exceeds(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text nests deeper than ``limit`` arrays and objects.

    C-speed passes instead of a Python loop per byte: strip everything but strings
    and brackets, drop the strings, then remove innermost bracket pairs once per
    level. Unbalanced brackets answer False and are left to the parser's message.
    """
    # left to right, so that in \\\" the escaped backslash goes first and the quote after it
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    # most strings are keys without brackets: drop the empty ones before the regex
    skeleton = _STRING.sub(b"", unescaped.translate(None, _NOT_SKELETON).replace(b'""', b""))
    for _ in range(limit):
        if not skeleton:
            return False
        skeleton, removed = _PAIR.subn(b"", skeleton)
        if not removed:
            return False
    return _PAIR.search(skeleton) is not None


def read_json(path: Path, *, max_bytes: int, error: type[EmuError], expected: str) -> Any:
    """The parsed document; gzip is recognised by its magic bytes, not the file name."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise error(f"{path}: no such file; give {expected}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror})") from None
    if path.is_dir():
        raise error(f"{path}: is a directory; give {expected}")
    if size > max_bytes:
        raise error(f"{path}: {size} bytes is more than the {max_bytes} bytes emu reads from "
                    f"such a file; give {expected}")
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
            data = fh.read(max_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise error(f"{path}: cannot read it ({exc})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: decompresses to more than the {max_bytes} bytes emu reads from such "
                    f"a file; give {expected}")
    # before decoding, so that the check's transient copies and the text never coexist
    if json_depth_exceeds(data):
        raise error(f"{path}: nests arrays and objects more than {MAX_JSON_DEPTH} deep, which no "
                    f"real file does; the file is corrupted or not what emu reads; give {expected}")
    try:
        # UTF-8 only, as before: a UTF-16 file is not what a profiler or emu writes
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not a JSON file ({exc}); give {expected}") from None
    del data  # the parser needs only the text: do not hold the file twice
    try:
        return json.loads(text, parse_int=_bounded_int)
    except _LongInt as exc:
        raise error(f"{path}: holds an integer of {exc.args[0]} digits, more than the "
                    f"{MAX_INT_DIGITS} any real file holds; the file is corrupted; "
                    f"give {expected}") from None
    except ValueError as exc:
        # JSONDecodeError, and any other refusal of the parser
        raise error(f"{path}: not a JSON file ({exc}); give {expected}") from None
    except RecursionError:
        # only reachable when the caller already sits deep in the stack
        raise error(f"{path}: nests too deep to parse; give {expected}") from None
