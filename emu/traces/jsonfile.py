"""Reading a JSON document that may be gzip-compressed, with bounded size and clear errors.

Shared by emu traces and the Kineto files that capture imports; the caller names
the error class and what the file should have been.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from emu.errors import EmuError


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
        with (gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")) as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not a JSON file ({exc}); give {expected}") from None
    except (OSError, EOFError) as exc:
        raise error(f"{path}: cannot read it ({exc})") from None
