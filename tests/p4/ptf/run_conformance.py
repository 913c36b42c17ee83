"""Run the conformance vectors on BMv2 (root, p4c-bm2-ss, simple_switch_grpc, finsy, ptf).

For each vector with 64-element packets: compile with its pool size, start BMv2 with a veth
port per worker, write the job's entries, run ``conformance.py`` under ptf, stop everything.
Vectors with 256-element packets are skipped: the program takes 64 (256 need recirculation).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from emu.p4.bmv2 import Bmv2Switch, host_interface

VECTORS = Path(__file__).resolve().parents[2] / "data" / "conformance"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ptf", default="ptf", help="the ptf command")
    args = parser.parse_args()
    failed = 0
    for path in sorted(VECTORS.glob("*.json")):
        cfg = json.loads(path.read_text())["config"]
        if cfg["elements"] != 64:
            print(f"skip {path.stem}: {cfg['elements']}-element packets need recirculation")
            continue
        with Bmv2Switch(cfg["workers"], cfg["slots"], job=cfg["job"]):
            ifaces = [arg for w in range(cfg["workers"]) for arg in ("--interface", f"{w + 1}@{host_interface(w)}")]
            env = {**os.environ, "EMU_VECTOR": str(path)}
            result = subprocess.run([args.ptf, "--test-dir", str(Path(__file__).parent), *ifaces,
                                     "--log-file", str(args.out / f"{path.stem}.log"), "conformance"],
                                    env=env, timeout=600)
            print(f"{path.stem}: {'ok' if result.returncode == 0 else 'FAILED'}")
            failed += result.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
