"""The conformance vectors on BMv2, through the PTF module in tests/p4/ptf (skipped without BMv2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emu.p4 import bmv2

HERE = Path(__file__).parent
PTF = shutil.which("ptf") or shutil.which("ptf", path=str(Path(sys.executable).parent))  # the venv's
needs = [t for t in bmv2.TOOLS if shutil.which(t) is None] + ([] if PTF else ["ptf"])
pytestmark = [pytest.mark.p4, pytest.mark.skipif(
    bool(needs) or os.geteuid() != 0,
    reason=(f"BMv2 conformance needs {', '.join(needs)} on PATH ({bmv2.INSTALL_HINT}, and pip install ptf)"
            if needs else "BMv2 conformance needs root for its veth ports"))]


def test_vectors_on_bmv2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(HERE / "ptf" / "run_conformance.py"), "--out", str(tmp_path),
                             "--ptf", str(PTF)],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
