"""Machines stood in for by network namespaces joined by a bridge, each with a hostname of its own
(its UTS namespace) and the others' in its /etc/hosts, as a cluster's nodes have, and torchrun
starting emu on each with one c10d rendezvous (docs/multi-host.md). Root and iproute2 are needed;
the namespaces and the bridge are removed whatever happens."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.replay.test_machines import exact_part, leftover_processes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
                       reason="network namespaces need root, iproute2 and unshare (util-linux)"),
]

_COUNT = itertools.count()
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
REPLAY = ["mlp", "--workers", "8", "--payload-scale", "64"]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespaces(tmp_path: Path):
    """``make(n)``: n namespace machines m0..m{n-1} at 10.77.<x>.1.. on one bridge."""
    tag = f"emut{os.getpid() % 1000}{next(_COUNT)}"  # a fixture's own: a deleted namespace's links linger
    subnet = (os.getpid() + next(_COUNT)) % 200 + 20
    made: list[str] = []
    bridge = f"{tag}br"

    def make(n: int) -> list[str]:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("link", "set", bridge, "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"10.77.{subnet}.{k + 1} m{k}\n" for k in range(n))
        for k in range(n):
            ns = f"{tag}m{k}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", f"{ns}h", "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", f"{ns}h", "master", bridge)
            _ip("link", "set", f"{ns}h", "up")
            _ip("-n", ns, "addr", "add", f"10.77.{subnet}.{k + 1}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)  # ip netns exec binds it over /etc/hosts
        return made

    yield make
    for ns in made:
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    assert not leftover_processes(str(tmp_path)), "a machine's processes outlived the test"


def torchrun(ns: list[str], args: list[str], folder: Path, port: int = 29400) -> list[subprocess.Popen]:
    """The same command on every machine: torchrun, c10d rendezvous at m0."""
    procs = []
    for k, name in enumerate(ns):
        cmd = (f"hostname m{k} && exec {TORCHRUN} --nnodes {len(ns)} --nproc-per-node 1 --rdzv-backend c10d "
               f"--rdzv-endpoint m0:{port} --max-restarts 0 -m emu replay {' '.join(args)} "
               f"--report {folder}/m{k}.json")
        procs.append(subprocess.Popen(["ip", "netns", "exec", name, "unshare", "--uts", "sh", "-c", cmd],
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
    for pid in subprocess.run(["ip", "netns", "pids", ns[dead]], capture_output=True, text=True).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    codes = {k: p.wait(120) for k, p in enumerate(procs)}
    for k in range(3):
        if k != dead:
            err = (tmp_path / f"err{k}.txt").read_text()
            assert codes[k] == 1, err[-3000:]
            said = ("stopped answering", "ended the run", "a host process left", "RendezvousConnectionError")
            assert any(s in err for s in said), err[-3000:]
