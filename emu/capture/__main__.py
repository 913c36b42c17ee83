"""Entry point of a rank process: ``python -m emu.capture --out DIR --warmup W --steps K -- TARGET``.

emu's launcher starts this; users run ``emu capture`` instead.
"""

import argparse
from pathlib import Path

from emu.capture.inject import end, run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m emu.capture")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        parser.error("give the script to run after --")
    end(run(args.out, args.warmup, args.steps, target))  # the rank's exit: see emu.capture.inject.end


if __name__ == "__main__":
    main()
