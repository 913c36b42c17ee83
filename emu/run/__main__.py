"""Entry point of a real rank of ``emu run``: ``python -m emu.run --address ADDR --clock thread --timeout S [--compress NAME] -- TARGET``.

emu run starts this; users run ``emu run`` instead. It registers emu's backend, maps the
backend the script asks ``init_process_group`` for (gloo, nccl, or none) onto it, follows the
first optimizer that steps (its step's pre-hook: every gradient was reduced; its post-hook: the
iteration ends), runs the unmodified script as ``python`` would, and ends the rank as capture's
ranks end (``emu.capture.inject.end``).
"""

import argparse

from emu.capture.inject import end
from emu.run.protocol import ComputeClock
from emu.run.rank import run


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m emu.run")
    parser.add_argument("--address", required=True)
    parser.add_argument("--clock", choices=[c.value for c in ComputeClock], required=True)
    parser.add_argument("--timeout", type=float, required=True, help="seconds a call may wait for the coordinator")
    parser.add_argument("--compress", help="the compressor of the rank's gradients (emu run --compress)")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not target:
        parser.error("give the script to run after --")
    end(run(args.address, ComputeClock(args.clock), args.timeout, target, args.compress))


if __name__ == "__main__":
    main()
