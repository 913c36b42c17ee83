"""Hosts on one machine: two network namespaces joined by a veth pair, shaped with tc
(``TwoHosts``, for validation), or several on a bridge with hostnames of their own
(``BridgedHosts``, for replays spread over machines).

Rank r runs in namespace ``emu-v<pid>-<r>`` (pid: emu's) behind an interface of the same
name with address 10.213.0.<r+1>/24. A bandwidth shapes both directions with ``tbf`` (this
kernel has no ``netem``: delay and loss are not shaped). Each end's received packets are
processed on one CPU of their own (``steer``): a veth hands a packet to the receiving stack on
whichever CPU sent it, and the tbf sends from its timer and from the sending rank, on either
core, so a flow's packets overtook each other, TCP took that for loss and retransmitted, and the
mlp at 1 Gbit/s stepped in 300-360 ms where the link allows 240 (docs/FIDELITY.md). Everything is removed on exit,
success or not, and a run first removes what runs that are gone left (``cleanup``). The
names are the run's own, so that two validations do not share (or remove) each other's
namespaces, and a dead run's record never names a live run's. Every command runs as a
child that dies with emu (``emu.lifetime.child_preexec``), and the namespaces and
interfaces go into the run record, so that ``emu clean`` removes them after a run killed
with SIGKILL.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from emu.capture.launcher import RankNetwork
from emu.errors import ConfigError
from emu.lifetime import child_preexec, current, signals_held

PREFIX = "emu-v"
SUBNET = "10.213.0"
PROBE_PORT = 40001
# A probe transfer (``TwoHosts.probe``): a TCP stream from rank 0's host to rank 1's, timed at the
# receiver from its first byte to its last; nothing but bytes crosses, each side bounded in time.
# (programs for ``python -c``, their host, port and size written in by ``probe``)
_RECEIVER = """import json, socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(({host!r}, {port})); s.listen(1); s.settimeout(30)
c, _ = s.accept(); c.settimeout(30)
n, first, last = 0, None, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    now = time.perf_counter(); first = first or now; last = now; n += len(b)
print(json.dumps({{"bytes": n, "seconds": (last - first) if first else 0.0}}))
"""
_SENDER = """import socket, time
n, chunk = {nbytes}, bytes(1 << 20)
for _ in range(200):
    try:
        s = socket.create_connection(({host!r}, {port}), timeout=30); break
    except OSError:
        time.sleep(0.05)
while n > 0:
    s.sendall(chunk[:min(n, len(chunk))]); n -= len(chunk)
s.close()
"""

# Both ways at once (``TwoHosts.probe_both_ways``): one TCP connection, each end sending the other
# the same bytes while it receives, as a two-rank ring's all_reduce moves its halves; each end times
# what it received, first byte to last (a thread sends, the main thread receives; both bounded).
# (one program for both ends: whether it listens, its host, port and size written in)
_BOTH_WAYS = """import json, socket, threading, time
n = {nbytes}
if {listen}:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(({host!r}, {port})); s.listen(1); s.settimeout(30); c, _ = s.accept()
else:
    for _ in range(200):
        try:
            c = socket.create_connection(({host!r}, {port}), timeout=30); break
        except OSError:
            time.sleep(0.05)
c.settimeout(30)
def send():
    left, chunk = n, bytes(1 << 20)
    while left > 0:
        c.sendall(chunk[:min(left, len(chunk))]); left -= len(chunk)
sender = threading.Thread(target=send, daemon=True); sender.start()
got, first, last = 0, None, None
while got < n:
    b = c.recv(1 << 20)
    if not b:
        break
    now = time.perf_counter(); first = first or now; last = now; got += len(b)
sender.join(30)
c.close()
print(json.dumps({{"bytes": got, "seconds": (last - first) if first else 0.0}}))
"""


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        _call(["ip", "netns", "list"], timeout=10).check_returncode()
        _call(["tc", "-V"], timeout=10).check_returncode()
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "the ip and tc commands (iproute2) are missing"
    return None


def _call(cmd: list[str] | tuple[str, ...], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    with signals_held():
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=child_preexec)


def _run(*cmd: str) -> None:
    result = _call(cmd)
    if result.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} failed: {result.stderr.strip()[:200]}")


def _record(namespaces: tuple[str, ...] = (), interfaces: tuple[str, ...] = ()) -> None:
    """Name what is about to be made in the run record, before making it (a kill in between
    leaves at most a name that `emu clean` finds gone)."""
    record = current()
    if record is None:
        return
    record.namespaces += [n for n in namespaces if n not in record.namespaces]
    record.interfaces += [i for i in interfaces if i not in record.interfaces]
    record.save()


@dataclass
class TwoHosts:
    """A context manager for the two-rank network of one validation case."""

    rate_bps: float | None  # None: unshaped

    def __post_init__(self) -> None:
        # at most 14 characters (pids reach 4194304): interface names have 15
        self.names = (f"{PREFIX}{os.getpid()}-0", f"{PREFIX}{os.getpid()}-1")
        self.ifaces = self.names
        self.made: list[str] = []

    @property
    def network(self) -> RankNetwork:
        return RankNetwork(namespaces=self.names, interfaces=self.ifaces, master_addr=f"{SUBNET}.1")

    def __enter__(self) -> TwoHosts:
        cleanup()  # what a crashed run left (this process's pid may be a dead run's)
        _record(self.names, self.ifaces)
        try:
            for ns in self.names:
                _run("ip", "netns", "add", ns)
                self.made.append(ns)
            _run("ip", "link", "add", self.ifaces[0], "type", "veth", "peer", "name", self.ifaces[1])
            for r, (ns, iface) in enumerate(zip(self.names, self.ifaces, strict=True)):
                _run("ip", "link", "set", iface, "netns", ns)
                _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{SUBNET}.{r + 1}/24", "dev", iface)
                _run("ip", "netns", "exec", ns, "ip", "link", "set", iface, "up")
                _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
                steer(ns, iface, r)
                if self.rate_bps:
                    rate = f"{int(self.rate_bps)}bit"
                    # a bucket of a few packets and a queue deep enough for a bucket of gradients
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", iface, "root", "tbf",
                         "rate", rate, "burst", "64kb", "latency", "2000ms")
            return self
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def probe(self, nbytes: int) -> float:
        """Payload bits a second that a TCP transfer of ``nbytes`` got from rank 0's host to rank
        1's (first byte received to last): what the shaped link delivers now, on this machine."""
        at = {"host": f"{SUBNET}.2", "port": PROBE_PORT}
        receiver = subprocess.Popen(
            ["ip", "netns", "exec", self.names[1], sys.executable, "-c", _RECEIVER.format(**at)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=child_preexec)
        try:
            sender = _call(["ip", "netns", "exec", self.names[0], sys.executable, "-c",
                            _SENDER.format(nbytes=int(nbytes), **at)], timeout=60)
            out, err = receiver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise ConfigError("a probe transfer between the validation's namespaces took over 60 s") from None
        finally:
            if receiver.poll() is None:
                receiver.kill()
                receiver.wait()
        if sender.returncode or receiver.returncode:
            raise ConfigError(f"a probe transfer between the validation's namespaces failed: "
                              f"{(sender.stderr or err).strip()[-200:]}")
        doc = json.loads(out)
        return 8 * doc["bytes"] / doc["seconds"] if doc["seconds"] > 0 else 0.0

    def probe_both_ways(self, nbytes: int) -> float:
        """Payload bits a second of the slower direction while each host sends the other ``nbytes``
        on one TCP connection at once: what a two-rank ring's traffic gets from the link, each
        direction's data sharing it with the acknowledgements of the other's."""
        at = {"host": f"{SUBNET}.2", "port": PROBE_PORT + 1, "nbytes": int(nbytes)}
        ends = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _BOTH_WAYS.format(listen=listen, **at)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=child_preexec)
                for ns, listen in ((self.names[1], True), (self.names[0], False))]
        try:
            outs = [end.communicate(timeout=90) for end in ends]
        except subprocess.TimeoutExpired:
            raise ConfigError("a two-way probe between the validation's namespaces took over 90 s") from None
        finally:
            for end in ends:
                if end.poll() is None:
                    end.kill()
                    end.wait()
        if any(end.returncode for end in ends):
            raise ConfigError(f"a two-way probe between the validation's namespaces failed: "
                              f"{' '.join(err for _, err in outs).strip()[-200:]}")
        docs = [json.loads(out) for out, _ in outs]
        return min(8 * d["bytes"] / d["seconds"] if d["seconds"] > 0 else 0.0 for d in docs)

    def tcp_segments(self) -> tuple[int, int]:
        """TCP segments sent and retransmitted in both namespaces since they were made (their own
        counters, /proc/net/snmp): a link loses and reorders nothing, so retransmissions say that
        the machine, not the shaped link, set the pace."""
        sent = retransmitted = 0
        for ns in self.names:
            result = _call(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"])
            rows = [line.split() for line in result.stdout.splitlines() if line.startswith("Tcp:")]
            if result.returncode or len(rows) != 2:
                raise ConfigError(f"no TCP counters in namespace {ns}: {result.stderr.strip()[:200]}")
            counters = dict(zip(rows[0][1:], rows[1][1:], strict=True))
            sent += int(counters["OutSegs"])
            retransmitted += int(counters["RetransSegs"])
        return sent, retransmitted

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self.made):  # deleting a namespace deletes its veth end and qdisc
            _call(["ip", "netns", "del", ns])
        self.made = []


def steer(ns: str, iface: str, r: int) -> None:
    """Process what ``iface`` (in ``ns``) receives on CPU r (mod the CPUs): receive packet
    steering with one CPU keeps a flow's packets in order whichever CPU sent them, and rank r's
    on a CPU of its own keeps the two ends' work apart."""
    mask = 1 << (r % min(32, os.cpu_count() or 1))  # one 32-bit group of the mask
    _run("ip", "netns", "exec", ns, "sh", "-c", f"echo {mask:x} > /sys/class/net/{iface}/queues/rx-0/rps_cpus")


def _owner_alive(name: str) -> bool:
    """Whether the emu run named in a namespace's name (``emu-v<pid>-<r>``) still runs."""
    pid = name[len(PREFIX):].split("-")[0]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False  # an older emu's name, or this very process's (a leftover of its own)
    return os.path.exists(f"/proc/{pid}")


def cleanup() -> list[str]:
    """Remove the namespaces emu runs that are gone left (by name); returns what was removed."""
    try:
        out = _call(["ip", "netns", "list"], timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    gone = []
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX) and not _owner_alive(name):
            _call(["ip", "netns", "del", name])
            gone.append(name)
    return gone


_BRIDGED = itertools.count()


class BridgedHosts:
    """``n`` machines on one machine, for replays spread over several (docs/multi-host.md):
    namespaces on one bridge, at 10.214.<x>.k+1, each given a hostname of its own (``m<k>``,
    in its UTS namespace, by ``command``) that every one of them resolves (its /etc/hosts, which
    ``ip netns exec`` binds from /etc/netns/<name>/), as a cluster's nodes do. A context manager:
    every process inside is killed and everything removed on the way out."""

    def __init__(self, n: int) -> None:
        if not 0 < n < 10:
            raise ConfigError(f"{n} bridged hosts: 1 to 9")
        # names of this instance's own (a deleted namespace's links linger a moment); at most 15
        # characters with the veth's "h"
        tag = f"emu-b{os.getpid() % 100000}{next(_BRIDGED) % 10}"
        self.bridge = f"{tag}br"
        self.names = tuple(f"{tag}-{k}" for k in range(n))
        self.subnet = f"10.214.{(os.getpid() + next(_BRIDGED)) % 250}"
        self.made: list[str] = []
        self.bridged = False

    def command(self, k: int, shell: str) -> list[str]:
        """``shell`` run on machine ``k`` under its hostname."""
        return ["ip", "netns", "exec", self.names[k], "unshare", "--uts", "sh", "-c", f"hostname m{k} && {shell}"]

    def __enter__(self) -> BridgedHosts:
        _record(self.names, (self.bridge, *(f"{ns}h" for ns in self.names)))
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.subnet}.{k + 1} m{k}\n" for k in range(len(self.names)))
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            self.bridged = True
            _run("ip", "link", "set", self.bridge, "up")
            for k, ns in enumerate(self.names):
                _run("ip", "netns", "add", ns)
                self.made.append(ns)
                _run("ip", "link", "add", f"{ns}h", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "link", "set", f"{ns}h", "master", self.bridge)
                _run("ip", "link", "set", f"{ns}h", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.subnet}.{k + 1}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                etc = Path("/etc/netns") / ns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(hosts)
            return self
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def kill(self, k: int) -> None:
        """Every process of machine ``k``, with SIGKILL: the machine dies."""
        for pid in _call(["ip", "netns", "pids", self.names[k]]).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self.made):  # deleting a namespace deletes its veth end
            self.kill(self.names.index(ns))
            _call(["ip", "netns", "del", ns])
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self.made = []
        if self.bridged:
            _call(["ip", "link", "del", self.bridge])
            self.bridged = False
