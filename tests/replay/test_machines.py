"""A replay spread over several machines (docs/multi-host.md): the launcher's environment, sealed
messages, and real runs of ``python -m emu replay`` as machines on loopback ports, each its own
process group, started with a launcher's variables and always stopped. The runs through torchrun
in network namespaces are in test_machines_netns.py."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zmq

from emu.errors import ConfigError
from emu.replay.machines import sealed
from emu.replay.machines.cluster import Cluster, LauncherEnv, Machine, from_environment
from emu.replay.machines.sealed import Rejected, make, tag

# everything that depends on the machines, not on the emulation
MACHINE_KEYS = {"wall_s", "cpu_percent", "processes", "run_s", "events", "real_bytes", "machines"}
REPLAY = ["mlp", "--workers", "8", "--iters", "1", "--payload-scale", "64", "--processes", "1"]


def exact_part(doc: dict) -> dict:
    doc = dict(doc)
    doc["emulator"] = {k: v for k, v in doc["emulator"].items() if k not in MACHINE_KEYS}
    doc["config"] = {k: v for k, v in doc["config"].items() if k != "processes"}
    return doc


def free_port() -> int:
    """A port free a moment ago, below the kernel's ephemeral range: a port the kernel hands out
    (bind to 0) can be handed again to another test's outgoing connection before machine 0 binds
    it, which made a slow test beside others under xdist wait 60 s on a store that was not its own."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(10001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in 10000..{low} after 200 tries")


# -- the launcher's environment -------------------------------------------------------------

def test_torchrun_environment() -> None:
    env = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "m0", "MASTER_PORT": "29500", "LOCAL_WORLD_SIZE": "1",
           "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "1"}
    got = from_environment(env)
    assert got == LauncherEnv("torchrun", 2, 4, "m0", 29500, 1, agent_store=True, run_id="job7/1")
    assert from_environment({}) is None


def test_slurm_environment() -> None:
    """srun's tasks are machines; the batch script itself (SLURM_NTASKS, no step) runs alone, as
    does a launcher of one machine (without even MASTER_ADDR)."""
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "MASTER_ADDR": "node01",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_ID": "55", "SLURM_STEP_ID": "0"}
    got = from_environment(env)
    assert got is not None and (got.launcher, got.rank, got.world_size, got.master_port) == ("slurm", 1, 2, 29500)
    assert got.run_id == "slurm-55.0" and not got.agent_store
    assert from_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "55"}) is None
    assert from_environment({"RANK": "0", "WORLD_SIZE": "1"}) is None


@pytest.mark.parametrize(("env", "says"), [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not"),
    ({"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "RANK='x' is not a whole number"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "rank 2 of 2"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, "not a TCP port"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, "scontrol show hostnames"),
])
def test_bad_environments_say_what_to_set(env: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        from_environment(env)


def test_shares_follow_each_machines_processes() -> None:
    machines = [Machine(r, f"m{r}", "127.0.0.1", 2, p, "0", "f", 1) for r, p in enumerate((1, 3))]
    cluster = Cluster(LauncherEnv("env", 0, 2, "127.0.0.1", 1), None, b"k", machines)
    assert cluster.share(4) == [0, 1, 1, 1]
    assert cluster.share(2) == [0, 1]  # fewer hosts than processes (whole nodes): still in proportion


# -- sealed messages ------------------------------------------------------------------------

def _drain(sock: zmq.Socket, want: int, rejected_too: int) -> tuple[list[list[bytes]], int]:
    got: list[list[bytes]] = []
    rejected = 0
    deadline = time.monotonic() + 5
    while (len(got) < want or rejected < rejected_too) and time.monotonic() < deadline:
        if sock.poll(100):  # connections' messages arrive in any order
            try:
                got.append(sock.recv_multipart())
            except Rejected:
                rejected += 1
    return got, rejected


def test_frame_sockets_send_and_receive_as_pyzmq_does() -> None:
    """Over real TCP: a plain socket of ``make`` (a ``FrameSocket``, frames straight to pyzmq's
    backend) and pyzmq's own socket exchange the same messages both ways: bytes, numpy frames,
    one past the copy threshold sent without a copy, an empty frame; copies as bytes, or frames
    without; an empty queue is ``zmq.Again``."""
    ctx = zmq.Context()
    try:
        router = make(ctx, zmq.ROUTER, None, "data")
        assert isinstance(router, sealed.FrameSocket)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        ours, theirs = make(ctx, zmq.DEALER, None, "data", b"h0"), ctx.socket(zmq.DEALER)
        theirs.setsockopt(zmq.IDENTITY, b"h1")
        for s in (ours, theirs):
            s.connect(f"tcp://127.0.0.1:{port}")
        big = np.arange(1 << 15, dtype=np.float64)  # 256 KiB: past zmq.COPY_THRESHOLD, sent without a copy
        message = [b"SEG", np.arange(3, dtype=np.int64), big, b""]
        want = [b"SEG", np.arange(3, dtype=np.int64).tobytes(), big.tobytes(), b""]
        ours.send_multipart(message, copy=False)
        theirs.send_multipart(message, copy=False)
        got = {}
        for _ in range(2):  # two connections: either's message may come first
            assert router.poll(2000)
            ident, *frames = router.recv_multipart(zmq.NOBLOCK)
            got[ident] = frames
        assert got == {b"h0": want, b"h1": want}
        router.send_multipart([b"h0", *message], copy=False)
        assert ours.poll(2000)
        frames = ours.recv_multipart(zmq.NOBLOCK, copy=False)
        assert [f.bytes for f in frames] == want and all(isinstance(f, zmq.Frame) for f in frames)
        with pytest.raises(zmq.Again):
            ours.recv_multipart(zmq.NOBLOCK)
    finally:
        ctx.destroy(linger=0)


def test_sealed_sockets_drop_and_count_what_fails_authentication() -> None:
    """Over real TCP: a message under the run's key passes, frames intact, and so does the reply;
    one without a tag, one under another key, one with its frames re-cut, one sent again on the
    wire, one under another identity and one from the other channel are dropped and counted,
    never parsed."""
    key = b"k" * 32
    ctx = zmq.Context()
    try:
        router = make(ctx, zmq.ROUTER, key, "data")
        port = router.bind_to_random_port("tcp://127.0.0.1")
        good = make(ctx, zmq.DEALER, key, "data", b"h0")
        stranger = make(ctx, zmq.DEALER, b"x" * 32, "data", b"h1")
        control = make(ctx, zmq.DEALER, key, "control", b"h2")  # the right key, the wrong channel
        plain = ctx.socket(zmq.DEALER)
        plain.setsockopt(zmq.IDENTITY, b"h3")
        for s in (good, stranger, control, plain):
            s.connect(f"tcp://127.0.0.1:{port}")
        good.send_multipart([b"AGG", b"real"])
        (first,), _ = _drain(router, 1, 0)
        assert first == [b"h0", b"AGG", b"real"]
        # what an eavesdropper saw of that message, sent again as it was, and under another identity
        seq = (0).to_bytes(8, "little")
        wire = [b"AGG", b"real", seq, tag(sealed.derive(key, "data"), b">\x02\x00h0" + seq, [b"AGG", b"real"])]
        spy = ctx.socket(zmq.DEALER)
        spy.setsockopt(zmq.IDENTITY, b"h9")
        spy.connect(f"tcp://127.0.0.1:{port}")
        spy.send_multipart(wire)  # another identity: the tag names h0
        plain.send_multipart([b"AGG", b"forged"])
        stranger.send_multipart([b"AGG", b"forged"])
        control.send_multipart([b"AGG", b"forged"])
        plain.send_multipart([b"AG", b"Gforged", *wire[2:]])  # frames re-cut
        good.send_multipart([b"AGG", b"second"])
        got, rejected = _drain(router, 1, 5)
        assert got == [[b"h0", b"AGG", b"second"]]
        assert rejected == router.rejected == 5
        router.send_multipart([b"h0", b"GO", b"1"])
        assert good.poll(2000) and good.recv_multipart() == [b"GO", b"1"]
    finally:
        ctx.destroy(linger=0)


def test_a_message_sent_again_is_dropped() -> None:
    """The same authentic bytes twice on one connection (a replay on the wire): the second is
    dropped, its number already spent."""
    key = b"k" * 32
    ctx = zmq.Context()
    try:
        router = make(ctx, zmq.ROUTER, key, "data")
        port = router.bind_to_random_port("tcp://127.0.0.1")
        raw = ctx.socket(zmq.DEALER)
        raw.setsockopt(zmq.IDENTITY, b"h0")
        raw.connect(f"tcp://127.0.0.1:{port}")
        seq = (0).to_bytes(8, "little")
        wire = [b"DONE", seq, tag(sealed.derive(key, "data"), b">\x02\x00h0" + seq, [b"DONE"])]
        raw.send_multipart(wire)
        raw.send_multipart(wire)
        got, rejected = _drain(router, 1, 1)
        assert got == [[b"h0", b"DONE"]] and rejected == 1
    finally:
        ctx.destroy(linger=0)


# -- machines on loopback -------------------------------------------------------------------

@dataclass
class Run:
    procs: list[subprocess.Popen]
    folder: Path

    def wait(self, timeout: float = 120) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            codes.append(p.wait(max(1.0, deadline - time.monotonic())))
        return codes

    def err(self, rank: int) -> str:
        return (self.folder / f"err{rank}.txt").read_text()

    def report(self, rank: int = 0) -> dict:
        return json.loads((self.folder / f"r{rank}.json").read_text())


def leftover_processes(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (forked hosts keep their parent's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def machines(tmp_path: Path):
    """Start ``n`` machines (``python -m emu replay``, each its own session); always stopped."""
    started: list[subprocess.Popen] = []

    def start(n: int, args: list[str], env_of=None, port: int | None = None) -> Run:
        port = port or free_port()
        for rank in range(n):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port), "EMU_JOIN_TIMEOUT": "60", "NO_COLOR": "1"}
            if env_of is not None:
                env = env_of(rank, env)
            cmd = env.pop("_CMD", None)
            report = env.pop("_REPORT", str(tmp_path / f"r{rank}.json"))
            argv = [*(json.loads(cmd) if cmd else [sys.executable, "-m", "emu"]), "replay", *args, "--report", report]
            started.append(subprocess.Popen(argv, env=env, stdout=open(tmp_path / f"out{rank}.txt", "w"),
                                            stderr=open(tmp_path / f"err{rank}.txt", "w"), start_new_session=True))
        return Run(started[-n:], tmp_path)

    yield start
    for p in started:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert not leftover_processes(str(tmp_path)), "a machine's processes outlived the test"
    _forget_killed({p.pid for p in started if p.returncode == -signal.SIGKILL})


def _forget_killed(pids: set[int]) -> None:
    """What the machines this test killed with SIGKILL left (their work folders and run records, as
    `emu clean` would remove them), so that the suite leaves nothing behind (issue 37); only theirs:
    other tests' records are not this one's to touch."""
    import shutil

    from emu import lifetime

    for path, rec, left in lifetime.leftovers():
        if rec.pid in pids:
            for item in left:
                if item.what == "folder":
                    shutil.rmtree(item.name, ignore_errors=True)
            path.unlink(missing_ok=True)


def test_two_machines_give_the_report_of_one(machines, tmp_path: Path) -> None:
    """The same command on two machines (a launcher's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT):
    machine 0 writes the report, identical to one machine's with as many host processes; machine
    1 says it hosted its share and writes nothing."""
    run = machines(2, [*REPLAY, "--fabric", "ina"])
    assert run.wait() == [0, 0], run.err(0) + run.err(1)
    spread = run.report(0)
    assert not (tmp_path / "r1.json").exists()
    assert "hosted its share of the workers" in run.err(1)
    assert spread["emulator"]["machines"] == 2 and spread["emulator"]["rejected_messages"] == 0
    assert spread["verification"]["ok"] and spread["emulator"]["trustworthy"]
    one = subprocess.run([sys.executable, "-m", "emu", "replay", *REPLAY[:-1], "2", "--fabric", "ina", "--report",
                          str(tmp_path / "one.json"), "--launcher", "none"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "RANK": "0", "WORLD_SIZE": "2"})
    assert one.returncode == 0, one.stderr
    assert exact_part(spread) == exact_part(json.loads((tmp_path / "one.json").read_text()))


@pytest.mark.slow
def test_forged_messages_are_dropped_and_counted(machines, tmp_path: Path) -> None:
    """Someone who can reach machine 0's ports (the plan's endpoints are in the store, which
    anyone can read) sends messages without the key: the run still completes exactly, and the
    report counts what the switch and the orchestrator dropped."""
    from datetime import timedelta

    from torch.distributed import PrefixStore, TCPStore

    port = free_port()
    # long enough to be reached mid-run (3 iterations took 0.4 s, over before a loaded machine's
    # client connected: torch's TCPStore client retries a refused connection only 20 to 60 s later)
    run = machines(2, [*REPLAY, "--iters", "40", "--fabric", "ina"], port=port)
    deadline = time.monotonic() + 60
    while True:  # the store listens: one connection attempt is enough
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline, f"the store never listened: {run.err(0)}"
        time.sleep(0.02)
    store = PrefixStore("emu/emu/0/0/", TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60),
                                                 wait_for_workers=False))
    store.wait(["run/0/plan"], timedelta(seconds=60))
    plan = json.loads(json.loads(store.get("run/0/plan"))["doc"])  # tagged, not hidden
    for address in (plan["switch"], plan["control"]):  # bound (the switch binds in its own process)
        host, _, tcp = address.removeprefix("tcp://").rpartition(":")
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex((host, int(tcp))) == 0:
                    break
            assert time.monotonic() < deadline, f"{address} never listened: {run.err(0)}"
            time.sleep(0.05)
    ctx = zmq.Context()
    try:
        for address in (plan["switch"], plan["control"]):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(address)
            for frames in ([b"AGG", b"\0" * 64], [b"{\"type\":\"stop\"}"], [b"DONE", b"x", b"\0" * 16]):
                sock.send_multipart(frames)
        time.sleep(0.5)
    finally:
        ctx.destroy(linger=1000)
    assert run.wait() == [0, 0], run.err(0) + run.err(1)
    report = run.report(0)
    assert report["verification"]["ok"] and report["complete"]
    assert report["emulator"]["rejected_messages"] == 6


@pytest.mark.slow
def test_a_machine_of_another_emu_version_is_refused(machines) -> None:
    old = json.dumps([sys.executable, "-c", "import emu; emu.__version__ = '0.0.9'; "
                      "import emu.replay.machines.cluster as m; m.__version__ = '0.0.9'; from emu.cli import main; main()"])

    def env_of(rank: int, env: dict) -> dict:
        return {**env, "_CMD": old} if rank == 1 else env

    run = machines(2, [*REPLAY, "--fabric", "ring"], env_of)
    codes = run.wait()
    assert codes == [2, 2], run.err(0) + run.err(1)
    for rank in (0, 1):
        assert "machine 1 (" in run.err(rank) and "runs emu 0.0.9" in run.err(rank)
        assert "install the same version on every machine" in run.err(rank)


@pytest.mark.slow
def test_machines_given_other_traces_are_refused(machines) -> None:
    port = free_port()
    first = machines(1, REPLAY, lambda rank, env: {**env, "WORLD_SIZE": "2"}, port=port)
    second = machines(1, ["cnn", *REPLAY[1:]], lambda rank, env: {**env, "RANK": "1", "WORLD_SIZE": "2"}, port=port)
    codes = first.wait() + second.wait()
    assert codes == [2, 2], first.err(0) + second.err(0)
    assert "was given other traces, options or files than machine 0" in first.err(0)
    assert "trace_args is ['mlp'] there and ['cnn'] here" in first.err(0), first.err(0)


@pytest.mark.slow
def test_a_machine_that_never_joins_is_named(machines) -> None:
    run = machines(1, REPLAY, lambda rank, env: {**env, "WORLD_SIZE": "3", "EMU_JOIN_TIMEOUT": "3"})
    assert run.wait() == [1]
    assert "machines 1, 2 of 3 never joined within 3 s" in run.err(0)


@pytest.mark.slow
def test_a_killed_machine_ends_the_run_everywhere(machines, tmp_path: Path) -> None:
    """Machine 1 (its emu and its host processes) killed with SIGKILL mid-run: machine 0 and
    machine 2 end with exit code 1, machine 0 names what happened, and nothing is left running."""
    run = machines(3, [*REPLAY, "--iters", "40", "--fabric", "ring"])
    deadline = time.monotonic() + 90
    while "on 3 machines: 25%" not in run.err(0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "25%" in run.err(0), run.err(0)
    assert run.procs[1].poll() is None, run.err(1)
    os.killpg(run.procs[1].pid, signal.SIGKILL)
    codes = run.wait(timeout=60)
    assert codes[0] == 1 and codes[2] == 1, run.err(0) + run.err(2)
    assert codes[1] == -signal.SIGKILL
    assert "machine 1" in run.err(0) or "left the run" in run.err(0), run.err(0)
    assert "machine 0 ended the run" in run.err(2), run.err(2)


@pytest.mark.parametrize("env", [{}, pytest.param({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
                                                marks=pytest.mark.slow)])
def test_one_machine_never_imports_torch(env: dict) -> None:
    """Outside a launcher, or under one with a single machine, emu replay runs as always: no
    rendezvous, and torch is never imported."""
    code = ("import sys; from click.testing import CliRunner; from emu.cli import cli; "
            "r = CliRunner().invoke(cli, ['replay', 'mlp', '--workers', '2', '--iters', '1', '--payload-scale', '256']); "
            "assert r.exit_code == 0, r.output; assert 'torch' not in sys.modules, 'torch imported'")
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_cores_follow_a_cgroup_quota(tmp_path: Path) -> None:
    """A pod limited to 1.5 CPUs counts 1 core however many the node has; no quota, its affinity."""
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    from emu.replay.machines.cluster import cores_here

    assert cores_here(cpu_max=str(quota)) == 1
    quota.write_text("max 100000\n")
    assert cores_here(cpu_max=str(quota)) == len(os.sched_getaffinity(0))
    assert cores_here(cpu_max=str(tmp_path / "absent")) == len(os.sched_getaffinity(0))


@pytest.mark.slow
def test_machine_0_failing_before_the_run_ends_the_others_at_once(machines, tmp_path: Path) -> None:
    """Machine 0 refuses its --report (its folder is a file) after joining and before any run: it
    exits 2 saying why, and machine 1, waiting for the run's plan, ends at once with exit 1, not at
    a timeout."""
    (tmp_path / "file").write_text("")
    t0 = time.monotonic()
    run = machines(2, [*REPLAY, "--fabric", "ring"],
                   lambda rank, env: {**env, "_REPORT": str(tmp_path / "file" / "r.json")} if rank == 0 else env)
    assert run.wait() == [2, 1], run.err(0) + run.err(1)
    assert "--report" in run.err(0)
    assert "machine 0 (" in run.err(1) and "is not a folder" in run.err(1)  # machine 0's own words
    assert time.monotonic() - t0 < 50  # the plan's wait is 60 s here (EMU_JOIN_TIMEOUT)


@pytest.mark.slow
def test_machines_given_other_options_are_refused(machines) -> None:
    port = free_port()
    first = machines(1, [*REPLAY, "--fabric", "ring"], lambda rank, env: {**env, "WORLD_SIZE": "2"}, port=port)
    second = machines(1, [*REPLAY, "--fabric", "ring", "--loss", "0.01"],
                      lambda rank, env: {**env, "RANK": "1", "WORLD_SIZE": "2"}, port=port)
    assert first.wait() + second.wait() == [2, 2], first.err(0) + second.err(0)
    assert "other traces, options or files than machine 0" in first.err(0), first.err(0)
    assert "options.loss is 0.0 there and 0.01 here" in first.err(0), first.err(0)


@pytest.mark.slow
def test_a_machine_without_hosts_stays_in_the_run(machines) -> None:
    """More machines than host processes: machine 2 holds none, still says it is alive for the
    whole run (longer than the 10 s a silent machine is given), and ends with the report."""
    run = machines(3, ["mlp", "--workers", "2", "--iters", "400", "--payload-scale", "64", "--processes", "1",
                       "--fabric", "ring"])
    assert run.wait(timeout=300) == [0, 0, 0], run.err(0) + run.err(2)
    assert run.report(0)["emulator"]["run_s"] > 10, "the run was too short to show it"


@pytest.mark.slow
def test_spans_of_every_machine_reach_the_chrome_trace(machines, tmp_path: Path) -> None:
    run = machines(2, [*REPLAY, "--fabric", "ring", "--chrome-trace", str(tmp_path / "spans.json")])
    assert run.wait() == [0, 0], run.err(0) + run.err(1)
    events = json.loads((tmp_path / "spans.json").read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert {e["tid"] for e in events if e.get("ph") == "X"} == set(range(8))
