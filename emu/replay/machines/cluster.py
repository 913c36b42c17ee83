"""Several machines: the launcher's environment, the rendezvous, and what the machines agree on
(docs/multi-host.md).

The same ``emu replay`` command runs on every machine, started by the launcher users already
have (torchrun, srun, a Kubernetes job for PyTorch). Each machine finds its rank and the
rendezvous in the environment (``from_environment``), joins torch.distributed's TCPStore (the
store torchrun's c10d rendezvous already runs, or one rank 0 serves), registers itself (address,
cores, host processes, emu version, the secret's fingerprint) and checks that every machine runs
the same emu with the same key (``join``). Rank 0 then plans, runs the switch and orchestrates
(``emu.replay.control.processes``); every other machine hosts its share of the worker host processes
(``emu.replay.machines.remote``). The store carries only small JSON documents: who is where, each run's
endpoints and digest, its outcome and report. The data goes over pyzmq, authenticated
(``emu.replay.machines.sealed``).

torch is imported here only, and only by ``join``: a replay on one machine never imports it.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from datetime import timedelta
from typing import Any

from emu import __version__
from emu.errors import ConfigError, EmuError, RunFailed

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
        if world == 1:
            return None  # a launcher of one machine: a replay on it alone
        if "MASTER_ADDR" not in env:
            raise ConfigError("RANK and WORLD_SIZE are set but MASTER_ADDR is not: set MASTER_ADDR and MASTER_PORT "
                              "to the rendezvous (machine 0), or run emu replay --launcher none")
        port = _int(env, "MASTER_PORT")
        local = _int(env, "LOCAL_WORLD_SIZE", 1)
        run_id = f"{env.get('TORCHELASTIC_RUN_ID', 'emu')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        # srun's tasks (a step's); the batch script itself, with SLURM_NTASKS but no step, runs alone
        launcher = "slurm"
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
        if world == 1:
            return None
        if "MASTER_ADDR" not in env:
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


def cores_here(local_world_size: int = 1, cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The cores this machine's emu may use: its CPU affinity (Slurm's and a static CPU manager's
    cpusets), capped by a cgroup v2 CPU quota (a Kubernetes pod's CPU limit), shared among the
    machines a launcher started on this host."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    try:
        quota, period = open(cpu_max).read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(int(quota) // int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 quota here
    return max(1, n // max(1, local_world_size))


def _source_address(host: str, port: int) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # a UDP connect sends nothing: the kernel only picks the route
        return str(s.getsockname()[0])


def _loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def route_address(host: str, port: int) -> str:
    """This machine's address on the way to ``host``: the source address the kernel picks for it.
    Loopback when the rendezvous is given as loopback (machines on one host); where a hostname
    resolves to loopback here only (Debian's ``127.0.1.1`` line for the machine's own name), the
    address of the default route instead, which the other machines can reach."""
    try:
        found = _source_address(host, port)
        if _loopback(found) and not _loopback(host):
            with contextlib.suppress(OSError):
                found = _source_address("192.0.2.1", 9)  # TEST-NET-1: never contacted, only routed
        return found
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
        self.agreements = 0  # agree() calls so far, numbered alike on every machine
        self.listener: socket.socket | None = None  # the store's listening socket, where rank 0 serves it

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

    def endpoints(self, n: int) -> tuple[list[str], list[socket.socket]]:
        """``n`` distinct TCP endpoints on this machine's address, and the sockets that hold their
        ports: bound (SO_REUSEADDR, never listening), so that the kernel hands them to nothing else
        until the switch and the orchestrator have bound them in processes of their own; close
        them after that."""
        held = []
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.me.address, 0))
            held.append(s)
        return [f"tcp://{self.me.address}:{s.getsockname()[1]}" for s in held], held

    # -- the store: small JSON documents --------------------------------------------------
    def put(self, key: str, doc: Any) -> None:
        """A document in the store, tagged under the key: anyone can write the store, only the
        machines can write what they read from it."""
        put_doc(self.store, self.key, key, doc)

    def has(self, key: str) -> bool:
        try:
            return bool(self.store.check([key]))
        except RuntimeError:
            return False

    def left(self, rank: int) -> str | None:
        """Why machine ``rank`` left (its error, or "" for a clean end), or None while it is here."""
        if not self.has(f"left/{rank}"):
            return None
        try:
            return str(get_doc(self.store, self.key, f"left/{rank}")["error"] or "")
        except (ConfigError, RuntimeError, KeyError, TypeError):
            return ""

    def get(self, key: str, timeout_s: float | None = None, what: str = "", source: int = 0) -> Any:
        """The document under ``key``, which machine ``source`` gives, waiting for it at most
        ``timeout_s``; a MachineLost as soon as that machine has left without giving it."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        who = self.machines[source].hostname if len(self.machines) > source else f"rank {source}"
        try:
            while not self.store.check([key]):
                gone = self.left(source) if source != self.rank else None
                if gone is not None:
                    raise MachineLost(f"machine {source} ({who}) left before giving {what or key}: "
                                      f"{gone or 'its output says why'}")
                if time.monotonic() > deadline:
                    raise MachineLost(f"machine {self.rank}: {what or key} did not arrive within {wait:.0f} s")
                time.sleep(0.02)
            return get_doc(self.store, self.key, key)
        except RuntimeError as exc:  # the store gone (DistNetworkError is a RuntimeError)
            raise MachineLost(f"machine {self.rank}: the rendezvous store stopped answering while waiting for "
                              f"{what or key} ({str(exc).splitlines()[0][:160]})") from None

    def agree(self, what: str, doc: Any) -> None:
        """Every machine gave the same ``doc`` (its traces' hashes, its options): else a ConfigError
        on every machine naming the first that differs."""
        n = self.agreements
        self.agreements += 1
        mine = hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()
        self.put(f"agree/{n}/{self.rank}", {"digest": mine, "doc": doc})
        first = self.get(f"agree/{n}/0", what=f"machine 0's {what}")
        ranks = range(1, self.world) if self.rank == 0 else [self.rank]
        for r in ranks:
            other = first if r == 0 else self.get(f"agree/{n}/{r}", what=f"machine {r}'s {what}", source=r)
            if other["digest"] != first["digest"]:
                raise ConfigError(f"machine {r} ({self.machines[r].hostname}) was given other {what} than machine 0 "
                                  f"({self.machines[0].hostname}): {_difference(first['doc'], other['doc'])}; run the "
                                  "same command with the same files on every machine")

    def close(self, error: str | None = None) -> None:
        """Leave (``error``: why, where this machine failed; the others waiting for it stop at
        once): rank 0 waits (briefly) until the others have read what it published, since the
        store it serves goes with it."""
        with contextlib.suppress(Exception):
            self.store.set_timeout(timedelta(seconds=5))  # a store already gone must not hold the exit
            self.put(f"left/{self.rank}", {"error": error})
        if self.rank == 0 and not self.env.agent_store:
            joined = [r for r in range(1, self.world) if self.has(f"machine/{r}")]  # the others never read it
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and not all(self.has(f"left/{r}") for r in joined):
                time.sleep(0.05)
        if self.listener is not None:
            self.listener.close()


def _doc_tag(key: bytes, name: str, text: str) -> str:
    return hashlib.blake2b(f"{name}\0{text}".encode(), key=key, digest_size=16, person=b"emu-store").hexdigest()


def put_doc(store: Any, key: bytes, name: str, doc: Any) -> None:
    text = json.dumps(doc, separators=(",", ":"))
    store.set(name, json.dumps({"doc": text, "tag": _doc_tag(key, name, text)}))


def get_doc(store: Any, key: bytes, name: str) -> Any:
    """A document the machines wrote under ``name``; ConfigError where its tag does not match
    (someone else wrote it: the store is open to anyone who reaches it)."""
    try:
        sealed = json.loads(store.get(name))
        text = sealed["doc"]
        ok = hmac.compare_digest(_doc_tag(key, name, text), str(sealed["tag"]))
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"the rendezvous store's {name} was not written by a machine of this run (its tag does "
                          "not match): someone else can write the store; set EMU_SECRET on every machine")
    return json.loads(text)


def _difference(a: Any, b: Any, path: str = "") -> str:
    """The first leaf where two documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
    return f"{path or 'it'} is {a!r} there and {b!r} here"


def join(env: LauncherEnv, processes: int | None = None, secret: str | None = None, address: str | None = None,
         timeout_s: float = JOIN_TIMEOUT_S) -> Cluster:
    """Join the machines of ``env``'s launcher: connect to the rendezvous store (rank 0 serves it,
    on its own address only, unless torchrun already does), register, and check everyone's emu
    version and secret.

    ``processes``: worker host processes here (default: its cores); ``secret``: the shared secret
    (EMU_SECRET; without one, rank 0 draws a key and hands it out through the store, which is then
    as trusted as the network it runs on); ``address``: where the others reach this machine
    (default: its address toward the rendezvous)."""
    if processes is not None and processes < 1:
        raise ConfigError(f"--processes {processes}: a machine runs at least 1 host process")
    if not 0 < timeout_s < 1e6:
        raise ConfigError(f"a join timeout of {timeout_s} s: give seconds between 0 and 1e6 (EMU_JOIN_TIMEOUT)")
    try:
        from torch.distributed import PrefixStore, TCPStore
    except ImportError:
        raise ConfigError("a replay spread over several machines joins torch.distributed's rendezvous, and torch is "
                          "not installed here: pip install torch (a replay on one machine does not need it)") from None
    serve = env.rank == 0 and not env.agent_store
    here_address = address or route_address(env.master_addr, env.master_port)
    listener = None
    where = f"{env.master_addr}:{env.master_port}"
    try:
        if serve:  # torch's own server listens on every interface: emu hands it a socket on its address alone
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((here_address, env.master_port))
            listener.listen(max(128, env.world_size))
        base = TCPStore(env.master_addr, env.master_port, env.world_size if serve else None, is_master=serve,
                        timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
                        master_listen_fd=None if listener is None else listener.fileno())
        # this command's keys apart from an earlier one's in a store torchrun keeps (the same run id)
        invocation = (int(base.add(f"emu/{env.run_id}/joined", 1)) - 1) // env.world_size
    except (RuntimeError, OSError) as exc:
        if listener is not None:
            listener.close()
        verb = "serve" if serve else "reach"
        raise MachineLost(f"machine {env.rank} could not {verb} the rendezvous store at {where} within "
                          f"{timeout_s:.0f} s ({str(exc).splitlines()[0][:160]})") from None
    store = PrefixStore(f"emu/{env.run_id}/{invocation}/", base)
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
    except (RuntimeError, ValueError) as exc:
        raise MachineLost(f"machine {env.rank}: machine 0 did not register within {timeout_s:.0f} s "
                          f"({str(exc).splitlines()[0][:160]})") from None
    here = Machine(rank=env.rank, hostname=socket.gethostname(), address=here_address,
                   cores=cores_here(env.local_world_size),
                   processes=processes if processes is not None else cores_here(env.local_world_size),
                   version=__version__, fingerprint=fingerprint(key), pid=os.getpid())
    cluster = Cluster(env, store, key, [], timeout_s)
    cluster.listener = listener
    try:
        _register(cluster, here)
    except EmuError as exc:  # the others learn why at once (and rank 0's store outlives their reading)
        cluster.close(str(exc))
        raise
    return cluster


def _register(cluster: Cluster, here: Machine) -> None:
    env, store, key, timeout_s = cluster.env, cluster.store, cluster.key, cluster.timeout_s
    where = f"{env.master_addr}:{env.master_port}"
    cluster.put(f"machine/{env.rank}", asdict(here))
    keys = [f"machine/{r}" for r in range(env.world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError:
        missing = [r for r, k in enumerate(keys) if not cluster.has(k)]
        raise MachineLost(f"machine{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of "
                          f"{env.world_size} never joined within {timeout_s:.0f} s: start emu replay there with the "
                          f"same MASTER_ADDR:MASTER_PORT ({where})") from None
    docs = [_machine_doc(store, key, k, here) for k in keys]
    first = docs[0]
    for doc in docs[1:] if env.rank == 0 else [asdict(here)]:
        if doc.get("version") != first.get("version"):
            raise ConfigError(f"machine {doc.get('rank')} ({doc.get('hostname')}) runs emu {doc.get('version')} and "
                              f"machine 0 ({first.get('hostname')}) emu {first.get('version')}: install the same "
                              "version on every machine")
        if doc.get("fingerprint") != first.get("fingerprint"):
            raise ConfigError(f"machine {doc.get('rank')} ({doc.get('hostname')}) holds another secret than machine 0 "
                              f"({first.get('hostname')}): give every machine the same EMU_SECRET (or none)")
    names = {f.name for f in fields(Machine)}
    try:
        cluster.machines = [Machine(**{k: v for k, v in doc.items() if k in names}) for doc in docs]
    except TypeError as exc:
        raise ConfigError(f"a machine registered without {exc}: the same emu on every machine") from None


def _machine_doc(store: Any, key: bytes, name: str, here: Machine) -> dict[str, Any]:
    """A machine's registration. Read even where its tag fails, for the message: another secret
    (its fingerprint differs) or a forgery (the same fingerprint, a wrong tag)."""
    try:
        return dict(get_doc(store, key, name))
    except ConfigError:
        try:
            doc = json.loads(json.loads(store.get(name))["doc"])
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"the rendezvous store's {name} is not a machine's registration: someone else "
                              "writes the store; set EMU_SECRET on every machine") from None
        if isinstance(doc, dict) and doc.get("fingerprint") != here.fingerprint:
            raise ConfigError(f"machine {doc.get('rank')} ({doc.get('hostname')}) holds another secret than machine "
                              f"{here.rank} ({here.hostname}): give every machine the same EMU_SECRET (or none)") from None
        raise


_CURRENT: contextvars.ContextVar[Cluster | None] = contextvars.ContextVar("emu_cluster", default=None)


def current() -> Cluster | None:
    """The machines the replays of this context are spread over (None: this machine alone)."""
    return _CURRENT.get()


@contextlib.contextmanager
def spread(cluster: Cluster) -> Iterator[Cluster]:
    """Replays inside spread over ``cluster``'s machines; it is left on the way out."""
    token = _CURRENT.set(cluster)
    error: str | None = None
    try:
        yield cluster
    except BaseException as exc:
        error = str(exc) or type(exc).__name__
        raise
    finally:
        _CURRENT.reset(token)
        cluster.close(error)


__all__ = ["Cluster", "LauncherEnv", "Machine", "MachineLost", "current", "from_environment", "join", "spread"]
