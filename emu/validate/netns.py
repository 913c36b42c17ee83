"""Two hosts on one machine: network namespaces joined by a veth pair, shaped with tc.

Rank r runs in namespace ``emu-v<r>`` behind interface ``emu-v<r>-eth`` with address
10.213.0.<r+1>/24. A bandwidth shapes both directions with ``tbf`` (this kernel has no
``netem``: delay and loss are not shaped). Everything is created with emu's names and
removed on exit, success or not; a run first removes what a crashed one left (``cleanup``).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from emu.capture.launcher import RankNetwork
from emu.errors import ConfigError

PREFIX = "emu-v"
SUBNET = "10.213.0"


def available() -> str | None:
    """None if namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, timeout=10)
        subprocess.run(["tc", "-V"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "the ip and tc commands (iproute2) are missing"
    return None


def _run(*cmd: str) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise ConfigError(f"{' '.join(cmd)} failed: {result.stderr.strip()[:200]}")


@dataclass
class TwoHosts:
    """A context manager for the two-rank network of one validation case."""

    rate_bps: float | None  # None: unshaped

    def __post_init__(self) -> None:
        self.names = (f"{PREFIX}0", f"{PREFIX}1")
        self.ifaces = (f"{PREFIX}0-eth", f"{PREFIX}1-eth")
        self.made: list[str] = []

    @property
    def network(self) -> RankNetwork:
        return RankNetwork(namespaces=self.names, interfaces=self.ifaces, master_addr=f"{SUBNET}.1")

    def __enter__(self) -> TwoHosts:
        cleanup()  # a crashed run's leftovers would collide with these names
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
                if self.rate_bps:
                    rate = f"{int(self.rate_bps)}bit"
                    # a bucket of a few packets and a queue deep enough for a bucket of gradients
                    _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", iface, "root", "tbf",
                         "rate", rate, "burst", "64kb", "latency", "2000ms")
            return self
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        for ns in reversed(self.made):  # deleting a namespace deletes its veth end and qdisc
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.made = []


def cleanup() -> list[str]:
    """Remove every namespace emu made (by name); returns what was removed."""
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    gone = []
    for line in out.splitlines():
        name = line.split()[0] if line.strip() else ""
        if name.startswith(PREFIX):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
            gone.append(name)
    return gone
