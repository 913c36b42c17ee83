"""Running the P4 program on BMv2: tools, compilation, veth ports, the switch process.

``--fabric bmv2`` needs ``p4c-bm2-ss`` and ``simple_switch_grpc`` (the p4lang packages),
finsy, and root (for veth pairs). Worker ``w`` is BMv2 port ``w + 1``: the switch side
of a veth pair ``emu<tag>s<w>`` is given to BMv2, the other side ``emu<tag>h<w>`` is where
emu's bridge (``emu.p4.bridge``) writes that worker's frames and reads its results.
Everything this module creates (processes, interfaces, the build folder) it removes
on every path; its interfaces' names start with ``emu`` and its folder's with ``emu-bmv2-``.
"""

from __future__ import annotations

import array
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from emu.errors import ConfigError
from emu.p4.entries import plan
from emu.p4.generate import PROGRAM

TOOLS = ("p4c-bm2-ss", "simple_switch_grpc")
INSTALL_HINT = ("build p4c (p4c-bm2-ss) and behavioral-model with PI (simple_switch_grpc) from p4lang's "
                "sources on GitHub and put them on PATH (docs/p4.md), and install finsy (pip install 'emu[p4]')")
# The P4Runtime device id: simple_switch_grpc is started with it and finsy asks for it
# (finsy's SwitchOptions default is 1, simple_switch_grpc's 0: a mismatch fails
# SetForwardingPipelineConfig with "Error when trying to assign device").
DEVICE_ID = 0
GRPC_START_S = 30.0
# the running switch's log, for the bridge's messages: set while a Bmv2Switch runs; the replay's
# processes are forked from the one that started it (emu.replay.control.children), so they see it
_LOG: Path | None = None


KEEP = "keep"  # a file in the switch's folder: a failure named its log, so the folder stays


def where_log() -> str:
    """Where BMv2's log is, for a failure's message; the switch's folder is then kept when it stops
    (the message may come from another process of the replay: the mark is a file)."""
    if _LOG is None:
        return "BMv2's log is in its emu-bmv2-* temporary folder"
    try:
        (_LOG.parent / KEEP).touch()
    except OSError:
        pass
    return f"BMv2's log: {_LOG}"


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def check_available() -> None:
    """Raise a ConfigError saying what is missing and how to get it."""
    missing = missing_tools()
    if missing:
        raise ConfigError(f"--fabric bmv2 needs {' and '.join(missing)}, not found on PATH; {INSTALL_HINT}")
    if os.geteuid() != 0:
        raise ConfigError("--fabric bmv2 needs root to create the veth pairs of the switch's ports; "
                          "run as root (or use --fabric ina, the software switch)")


@dataclass(frozen=True)
class Compiled:
    bmv2_json: Path
    p4info: Path


def compile_program(out: Path, slots: int) -> Compiled:
    """p4c-bm2-ss with the pool size of this replay; the P4Info for P4Runtime beside it."""
    out.mkdir(parents=True, exist_ok=True)
    compiled = Compiled(bmv2_json=out / "emu_agg.json", p4info=out / "emu_agg.p4info.txtpb")
    cmd = ["p4c-bm2-ss", "--arch", "v1model", f"-DEMU_SLOTS={slots}", "--p4runtime-files", str(compiled.p4info),
           "-o", str(compiled.bmv2_json), str(PROGRAM)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"p4c-bm2-ss could not compile {PROGRAM.name}: {tail[0]}")
    return compiled


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise ConfigError(f"--fabric bmv2 could not set up its ports (ip {' '.join(args)}): {said}")


# ethtool's ioctl (linux/ethtool.h, linux/sockios.h): segmentation and receive offloads off
SIOCETHTOOL = 0x8946
ETHTOOL_SET = {"tso": 0x1F, "gso": 0x24, "gro": 0x2C}


def _offloads_off(name: str) -> None:
    """No segmentation or receive offload on a switch port. With any on, libpcap sizes each slot of
    BMv2's capture ring for a 64 KiB packet, so its 2 MiB ring holds about 31 frames and a burst of
    more is lost before BMv2 reads it (measured: 16 of 48 contributions sent at once); with them off,
    a slot is one MTU and the ring holds about a thousand."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for cmd in ETHTOOL_SET.values():
            value = array.array("I", [cmd, 0])
            ifreq = struct.pack("16sP16x", name.encode(), value.buffer_info()[0])
            try:
                fcntl.ioctl(sock, SIOCETHTOOL, ifreq)
            except OSError:
                pass  # an offload the device does not have


def _sysctl(key: str, value: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    if path.exists():
        path.write_text(value)


# the running switch's interfaces are named for the process that started it, so that two replays
# on one machine do not collide (a name holds at most 15 characters: emu + 6 hex + s|h + 2 digits)
_TAG = ""


def host_interface(worker: int) -> str:
    """emu's side of worker ``worker``'s veth (the bridge's port)."""
    return f"emu{_TAG}h{worker}"


def switch_interface(worker: int) -> str:
    """BMv2's side of worker ``worker``'s veth (its port ``worker + 1``)."""
    return f"emu{_TAG}s{worker}"


class Bmv2Switch:
    """simple_switch_grpc with one veth port per worker and the job's entries written.

    A context manager: on exit (success, error or Ctrl-C) the switch is stopped and the
    interfaces and build folder removed.
    """

    def __init__(self, workers: int, slots: int, job: int = 0) -> None:
        check_available()
        self.workers, self.slots, self.job = workers, slots, job
        self.plan = plan(job, [w + 1 for w in range(workers)])
        self.dir = Path(tempfile.mkdtemp(prefix="emu-bmv2-"))
        self.proc: subprocess.Popen | None = None
        self.created: list[str] = []
        self.address = ""
        self.keep = False

    def __enter__(self) -> Bmv2Switch:
        global _TAG, _LOG
        _TAG = f"{os.getpid():06x}"[-6:]
        try:
            compiled = compile_program(self.dir, self.slots)
            for w in range(self.workers):
                _ip("link", "add", host_interface(w), "type", "veth", "peer", "name", switch_interface(w))
                self.created.append(host_interface(w))
                for name in (host_interface(w), switch_interface(w)):
                    # no IPv6 on the ports: the kernel would send its own frames (MLD, neighbour
                    # solicitations) into BMv2
                    _sysctl(f"net.ipv6.conf.{name}.disable_ipv6", "1")
                    _offloads_off(name)
                    _ip("link", "set", name, "up")
            port = _free_port()
            self.address = f"127.0.0.1:{port}"
            ifaces = [arg for w in range(self.workers) for arg in ("-i", f"{w + 1}@{switch_interface(w)}")]
            log_path = self.dir / "simple_switch.log"
            with open(log_path, "wb") as log:
                self.proc = subprocess.Popen(switch_command(ifaces, self.address), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            _wait_port(port, GRPC_START_S, self.proc, log_path)
            from emu.p4.control import push

            push(self.plan, self.address, compiled, log_path)
            _LOG = log_path
            return self
        except ConfigError:
            self.keep = self.proc is not None  # then the message names the switch's log in self.dir
            self.__exit__(None, None, None)
            raise
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        global _LOG
        _LOG = None
        if self.proc is not None and ((exc and exc[0] is not None) or (self.dir / KEEP).exists()):
            self.keep = True  # the run failed with the switch running: its log is named in the message
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for name in self.created:
            subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=30)
        self.created = []
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def switch_command(ifaces: list[str], address: str) -> list[str]:
    """simple_switch_grpc without a program (P4Runtime sets it), at DEVICE_ID, gRPC at address."""
    return ["simple_switch_grpc", "--no-p4", "--device-id", str(DEVICE_ID), *ifaces, "--",
            "--grpc-server-addr", address]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, timeout_s: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ConfigError(f"simple_switch_grpc exited with code {proc.returncode} at start; its log: {log}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise ConfigError(f"simple_switch_grpc did not open its gRPC port within {timeout_s:.0f} s; its log: {log}")
