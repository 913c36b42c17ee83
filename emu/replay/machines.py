"""Several machines: the launcher's environment, the rendezvous, and what the machines agree on
(docs/multi-host.md).

The same ``emu replay`` command runs on every machine, started by the launcher users already
have (torchrun, srun, a Kubernetes job for PyTorch). Each machine finds its rank and the
rendezvous in the environment (``from_environment``), joins torch.distributed's TCPStore (the
store torchrun's c10d rendezvous already runs, or one rank 0 serves), registers itself (address,
cores, host processes, emu version, the secret's fingerprint) and checks that every machine runs
the same emu with the same key (``join``). Rank 0 then plans, runs the switch and orchestrates
(``emu.replay.processes``); every other machine hosts its share of the worker host processes
(``emu.replay.remote``). The store carries only small JSON documents: who is where, each run's
endpoints and digest, its outcome and report. The data goes over pyzmq, authenticated
(``emu.replay.sealed``).

torch is imported here only, and only by ``join``: a replay on one machine never imports it.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

from emu import __version__
from emu.errors import ConfigError, RunFailed

JOIN_TIMEOUT_S = 120.0  # for every machine to register, and for a run's plan to appear
HEARTBEAT_S = 0.5  # the orchestrator and each machine say they are alive this often
MACHINE_TIMEOUT_S = 10.0  # silence after which a machine (or the orchestrator) counts as gone
DEFAULT_PORT = 29500  # torch's MASTER_PORT default, for srun without one


class MachineLost(RunFailed):
    """A machine of a replay spread over several stopped answering, or failed."""


@dataclass(frozen=True)
class LauncherEnv:
    """Where this process sits among the machines, as its launcher said."""

    launcher: str  # torchrun, slurm, or env (RANK and WORLD_SIZE set by anything else)
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_world_size: int = 1  # machines a launcher started on this host (cores are shared among them)
    agent_store: bool = False  # torchrun serves the store itself (its c10d rendezvous): connect, never serve
    run_id: str = "emu"  # keys of this run in a store it may share with torchrun's own


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None:
        if default is None:
            raise ConfigError(f"the launcher set no {name}: set it, or run emu replay --launcher none")
        return default
    digits = text.split("(")[0].split(",")[0].strip()  # SLURM_TASKS_PER_NODE looks like 2(x3),1
    try:
        return int(digits)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not a whole number") from None


def from_environment(env: Mapping[str, str]) -> LauncherEnv | None:
    """The launcher's description of this machine, or None outside a launcher. torchrun (and a
    Kubernetes PyTorchJob) set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; srun sets
    SLURM_PROCID and SLURM_NTASKS, and the batch script MASTER_ADDR (docs/multi-host.md)."""
    if "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        if "MASTER_ADDR" not in env:
            raise ConfigError("RANK and WORLD_SIZE are set but MASTER_ADDR is not: set MASTER_ADDR and MASTER_PORT "
                              "to the rendezvous (machine 0), or run emu replay --launcher none")
        port = _int(env, "MASTER_PORT")
        local = _int(env, "LOCAL_WORLD_SIZE", 1)
        run_id = f"{env.get('TORCHELASTIC_RUN_ID', 'emu')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        if "MASTER_ADDR" not in env and world > 1:
            raise ConfigError("srun started emu on several machines but MASTER_ADDR is not set: in the batch script, "
                              "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)")
        port = _int(env, "MASTER_PORT", DEFAULT_PORT)
        local = _int(env, "SLURM_NTASKS_PER_NODE", 1) if "SLURM_NTASKS_PER_NODE" in env else 1
        run_id = f"slurm-{env.get('SLURM_JOB_ID', '0')}.{env.get('SLURM_STEP_ID', '0')}"
    else:
        return None
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(f"the launcher says rank {rank} of {world} machines: a rank must be 0..world size - 1")
    if not 0 < port < 65536:
        raise ConfigError(f"MASTER_PORT {port} is not a TCP port (1..65535)")
    return LauncherEnv(launcher, rank, world, env.get("MASTER_ADDR", "127.0.0.1"), port, max(1, local),
                       agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true", run_id=run_id)


@dataclass(frozen=True)
class Machine:
    rank: int
    hostname: str
    address: str  # where the other machines reach its processes (rank 0's: the switch and the orchestrator)
    cores: int
    processes: int  # worker host processes it runs
    version: str
    fingerprint: str  # of the shared secret (never the secret)
    pid: int


def cores_here(local_world_size: int = 1) -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, n // max(1, local_world_size))


def route_address(host: str, port: int) -> str:
    """This machine's address on the way to ``host``: the source address the kernel picks for it
    (a UDP connect sends nothing). Loopback when the rendezvous is on loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    except OSError as exc:
        raise ConfigError(f"cannot find this machine's address toward the rendezvous {host}:{port} ({exc}): "
                          "set EMU_ADDRESS to the address the other machines reach it on") from None


def key_of(secret: str) -> bytes:
    return hashlib.blake2b(secret.encode(), digest_size=32, person=b"emu-secret").digest()


def fingerprint(key: bytes) -> str:
    return hashlib.blake2b(key, digest_size=8, person=b"emu-fingerprint").hexdigest()


class Cluster:
    """This machine's place among the machines of one replay, and the store they share."""

    def __init__(self, env: LauncherEnv, store: Any, key: bytes, machines: list[Machine],
                 timeout_s: float = JOIN_TIMEOUT_S) -> None:
        self.env, self.store, self.key, self.machines, self.timeout_s = env, store, key, machines, timeout_s
        self.rank, self.world = env.rank, env.world_size
        self.runs = 0  # runs (execute calls) so far: every machine makes the same ones in the same order
        self.hosted: list[int] = []  # the host processes this machine ran in its latest run

    @property
    def me(self) -> Machine:
        return self.machines[self.rank]

    def configure(self, config: Any) -> Any:
        """``config`` with the host processes of every machine together: the plan splits the workers
        among them as one machine with that many would."""
        return replace(config, processes=sum(m.processes for m in self.machines))

    def share(self, hosts: int) -> list[int]:
        """The machine of each of ``hosts`` worker host processes: consecutive runs, in proportion to
        each machine's processes."""
        total = sum(m.processes for m in self.machines)
        bounds = [0]
        for m in self.machines:
            bounds.append(bounds[-1] + m.processes)
        return [next(k for k in range(self.world) if h * total < bounds[k + 1] * hosts) for h in range(hosts)]

    def endpoints(self, n: int) -> list[str]:
        """``n`` TCP endpoints on this machine's address, on ports the kernel has free now (the
        switch and the orchestrator bind them moments later, in processes of their own)."""
        out = []
        for _ in range(n):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((self.me.address, 0))
                out.append(f"tcp://{self.me.address}:{s.getsockname()[1]}")
        return out

    # -- the store: small JSON documents --------------------------------------------------
    def put(self, key: str, doc: Any) -> None:
        self.store.set(key, json.dumps(doc, separators=(",", ":")))

    def get(self, key: str, timeout_s: float | None = None, what: str = "") -> Any:
        """The document under ``key``, waiting for it at most ``timeout_s``."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        try:
            self.store.wait([key], timedelta(seconds=wait))
            return json.loads(self.store.get(key))
        except (RuntimeError, ValueError) as exc:  # torch raises DistStoreError (a RuntimeError) on timeout
            raise MachineLost(f"machine {self.rank}: {what or key} did not arrive within {wait:.0f} s "
                              f"({str(exc).splitlines()[0][:160]})") from None

    def has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except RuntimeError:
            return False

    def agree(self, what: str, doc: Any) -> None:
        """Every machine gave the same ``doc`` (its traces' hashes, its options): else a ConfigError
        on every machine naming the first that differs."""
        n = getattr(self, "_agreements", 0)
        self._agreements = n + 1
        mine = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
        self.put(f"agree/{n}/{self.rank}", {"digest": mine, "doc": doc})
        first = self.get(f"agree/{n}/0", what=f"machine 0's {what}")
        ranks = range(1, self.world) if self.rank == 0 else [self.rank]
        for r in ranks:
            other = first if r == 0 else self.get(f"agree/{n}/{r}", what=f"machine {r}'s {what}")
            if other["digest"] != first["digest"]:
                raise ConfigError(f"machine {r} ({self.machines[r].hostname}) was given other {what} than machine 0 "
                                  f"({self.machines[0].hostname}): {_difference(first['doc'], other['doc'])}; run the "
                                  "same command with the same files on every machine")

    def close(self) -> None:
        """Leave: rank 0 waits (briefly) until the others have read what it published, since the
        store it serves goes with it."""
        with contextlib.suppress(Exception):
            self.store.set(f"left/{self.rank}", "1")
        if self.rank == 0 and not self.env.agent_store:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and not all(self.has(f"left/{r}") for r in range(1, self.world)):
                time.sleep(0.05)


def _difference(a: Any, b: Any) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return f"{k} is {a.get(k)!r} there and {b.get(k)!r} here"
    return f"{a!r} against {b!r}"


def join(env: LauncherEnv, processes: int | None = None, secret: str | None = None, address: str | None = None,
         timeout_s: float = JOIN_TIMEOUT_S) -> Cluster:
    """Join the machines of ``env``'s launcher: connect to the rendezvous store (rank 0 serves it
    unless torchrun already does), register, and check everyone's emu version and secret.

    ``processes``: worker host processes here (default: its cores); ``secret``: the shared secret
    (EMU_SECRET; without one, rank 0 draws a key and hands it out through the store, which is then
    as trusted as the network it runs on); ``address``: where the others reach this machine
    (default: its address toward the rendezvous)."""
    try:
        from torch.distributed import PrefixStore, TCPStore
    except ImportError:
        raise ConfigError("a replay spread over several machines joins torch.distributed's rendezvous, and torch is "
                          "not installed here: pip install torch (a replay on one machine does not need it)") from None
    serve = env.rank == 0 and not env.agent_store
    try:
        base = TCPStore(env.master_addr, env.master_port, env.world_size if serve else None, is_master=serve,
                        timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        verb = "serve" if serve else "reach"
        raise MachineLost(f"machine {env.rank} could not {verb} the rendezvous store at {env.master_addr}:"
                          f"{env.master_port} within {timeout_s:.0f} s ({str(exc).splitlines()[0][:160]})") from None
    store = PrefixStore(f"emu/{env.run_id}/", base)
    try:
        if env.rank == 0:
            key = key_of(secret) if secret else secrets.token_bytes(32)
            store.set("key", "secret" if secret else key.hex())  # a drawn key is handed out; a secret never
        else:
            store.wait(["key"], timedelta(seconds=timeout_s))
            given = store.get("key").decode()
            if given == "secret" and not secret:
                raise ConfigError(f"machine 0 was given EMU_SECRET and machine {env.rank} was not: give every machine "
                                  "the same EMU_SECRET (or none)")
            key = key_of(secret) if secret else bytes.fromhex(given)
    except RuntimeError as exc:
        raise MachineLost(f"machine {env.rank}: machine 0 did not register within {timeout_s:.0f} s "
                          f"({str(exc).splitlines()[0][:160]})") from None
    here = Machine(rank=env.rank, hostname=socket.gethostname(),
                   address=address or route_address(env.master_addr, env.master_port),
                   cores=cores_here(env.local_world_size),
                   processes=max(1, processes if processes is not None else cores_here(env.local_world_size)),
                   version=__version__, fingerprint=fingerprint(key), pid=os.getpid())
    cluster = Cluster(env, store, key, [], timeout_s)
    cluster.put(f"machine/{env.rank}", asdict(here))
    keys = [f"machine/{r}" for r in range(env.world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError:
        missing = [r for r, k in enumerate(keys) if not cluster.has(k)]
        raise MachineLost(f"machine{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of "
                          f"{env.world_size} never joined within {timeout_s:.0f} s: start emu replay there with the "
                          f"same MASTER_ADDR:MASTER_PORT ({env.master_addr}:{env.master_port})") from None
    cluster.machines = [Machine(**cluster.get(k)) for k in keys]
    first = cluster.machines[0]
    for m in cluster.machines[1:] if env.rank == 0 else [here]:
        if m.version != first.version:
            raise ConfigError(f"machine {m.rank} ({m.hostname}) runs emu {m.version} and machine 0 ({first.hostname}) "
                              f"emu {first.version}: install the same version on every machine")
        if m.fingerprint != first.fingerprint:
            raise ConfigError(f"machine {m.rank} ({m.hostname}) holds another secret than machine 0 ({first.hostname}): "
                              "give every machine the same EMU_SECRET (or none)")
    return cluster


_CURRENT: contextvars.ContextVar[Cluster | None] = contextvars.ContextVar("emu_cluster", default=None)


def current() -> Cluster | None:
    """The machines the replays of this context are spread over (None: this machine alone)."""
    return _CURRENT.get()


@contextlib.contextmanager
def spread(cluster: Cluster) -> Iterator[Cluster]:
    """Replays inside spread over ``cluster``'s machines; it is left on the way out."""
    token = _CURRENT.set(cluster)
    try:
        yield cluster
    finally:
        _CURRENT.reset(token)
        cluster.close()


__all__ = ["Cluster", "LauncherEnv", "Machine", "MachineLost", "current", "from_environment", "join", "spread"]
