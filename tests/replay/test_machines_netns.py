"""Machines stood in for by network namespaces joined by a bridge, each with a hostname of its own
(its UTS namespace) and the others' in its /etc/hosts, as a cluster's nodes have, and torchrun
starting emu on each with one c10d rendezvous (docs/multi-host.md). Root and iproute2 are needed;
the namespaces and the bridge are removed whatever happens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emu.validate.netns import BridgedHosts
from tests.replay.test_machines import exact_part, leftover_processes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
                       reason="network namespaces need root, iproute2 and unshare (util-linux)"),
]

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
REPLAY = ["mlp", "--workers", "8", "--payload-scale", "64"]


@pytest.fixture
def namespaces(tmp_path: Path):
    """``make(n)``: n namespace machines m0..m{n-1} on one bridge (``BridgedHosts``)."""
    made: list[BridgedHosts] = []

    def make(n: int) -> BridgedHosts:
        made.append(BridgedHosts(n).__enter__())
        return made[-1]

    yield make
    for hosts in made:
        hosts.__exit__(None, None, None)
    assert not leftover_processes(str(tmp_path)), "a machine's processes outlived the test"


def torchrun(hosts: BridgedHosts, args: list[str], folder: Path, port: int = 29400) -> list[subprocess.Popen]:
    """The same command on every machine: torchrun, c10d rendezvous at m0."""
    procs = []
    n = len(hosts.names)
    for k in range(n):
        cmd = (f"exec {TORCHRUN} --nnodes {n} --nproc-per-node 1 --rdzv-backend c10d "
               f"--rdzv-endpoint m0:{port} --max-restarts 0 -m emu replay {' '.join(args)} "
               f"--report {folder}/m{k}.json")
        procs.append(subprocess.Popen(hosts.command(k, cmd),
                                      stdout=open(folder / f"out{k}.txt", "w"), stderr=open(folder / f"err{k}.txt", "w"),
                                      cwd=Path(__file__).parents[2], env={**os.environ, "NO_COLOR": "1"}))
    return procs


def one_machine(args: list[str], processes: int, out: Path) -> dict:
    """The same replay on this machine with as many host processes as the machines had together."""
    done = subprocess.run([sys.executable, "-m", "emu", "replay", *args, "--processes", str(processes), "--report",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.mark.parametrize(("n", "fabric"), [(2, "ina"), (4, "ina"), (4, "ring"), (4, "ps")])
def test_torchrun_over_namespace_machines_gives_one_machines_report(namespaces, tmp_path: Path, n: int,
                                                                    fabric: str) -> None:
    ns = namespaces(n)
    args = [*REPLAY, "--iters", "2", "--fabric", fabric]
    procs = torchrun(ns, [*args, "--processes", "1"], tmp_path)
    codes = [p.wait(300) for p in procs]
    errs = "".join((tmp_path / f"err{k}.txt").read_text()[-2000:] for k in range(n))
    assert codes == [0] * n, errs
    written = [k for k in range(n) if (tmp_path / f"m{k}.json").exists()]
    assert len(written) == 1, "only machine 0 writes the report"
    spread = json.loads((tmp_path / f"m{written[0]}.json").read_text())
    assert spread["emulator"]["machines"] == n and spread["verification"]["ok"]
    assert exact_part(spread) == exact_part(one_machine(args, n, tmp_path / "one.json"))


@pytest.mark.parametrize("victim", ["orchestrator", "another"])
def test_a_killed_namespace_machine_ends_the_run_with_exit_1_everywhere(namespaces, tmp_path: Path,
                                                                        victim: str) -> None:
    """Every process of one namespace (its torchrun, emu and host processes) killed mid-run: the
    other machines' torchruns exit 1, and nothing of the run is left. Either emu says why (a
    machine stopped answering, machine 0 ended the run) or, where the namespace killed held
    torchrun's rendezvous (m0), torchrun's agents stop their workers first (RendezvousConnectionError)."""
    ns = namespaces(3)
    procs = torchrun(ns, [*REPLAY, "--iters", "60", "--processes", "1", "--fabric", "ring"], tmp_path)
    deadline = time.monotonic() + 180
    zero = None
    while zero is None and time.monotonic() < deadline:  # the machine whose progress lines show it is rank 0
        for k in range(3):
            if "on 3 machines: 25%" in (tmp_path / f"err{k}.txt").read_text():
                zero = k
        time.sleep(0.2)
    assert zero is not None, "".join((tmp_path / f"err{k}.txt").read_text()[-1500:] for k in range(3))
    dead = zero if victim == "orchestrator" else (zero + 1) % 3
    ns.kill(dead)
    codes = {k: p.wait(120) for k, p in enumerate(procs)}
    for k in range(3):
        if k != dead:
            err = (tmp_path / f"err{k}.txt").read_text()
            assert codes[k] == 1, err[-3000:]
            said = ("stopped answering", "ended the run", "a host process left", "RendezvousConnectionError")
            assert any(s in err for s in said), err[-3000:]
