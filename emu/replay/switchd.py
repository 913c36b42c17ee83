"""The switch process: the hub every endpoint's link ends at.

It aggregates contributions with the software INA data plane (``emu.emulator.switch``)
and forwards point-to-point segments to the host of their destination. A result
for every worker reaches each worker host as one message, which the host fans
out to its workers (their downlinks are still charged one by one there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import zmq

from emu.emulator.switch import MULTICAST, AggregationSwitch
from emu.emulator.transport import AGG, HELLO, RESULTS, SEG, AggBatch, FrameError, control, parse_control
from emu.emulator.wire import P2P_HEADER

HELLO_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SwitchSetup:
    address: str
    control_addr: str
    workers: int
    slots: int  # real slots
    elements: int
    aggregate: bool  # run the INA data plane
    worker_hosts: tuple[tuple[int, int], ...]  # per worker host: [first, last) worker ids
    endpoint_host: tuple[int, ...]  # host index of every endpoint (workers, then PS shards)
    bmv2_interfaces: tuple[str, ...] = ()  # aggregate on BMv2 through these veths instead


def switch_main(setup: SwitchSetup) -> None:
    ctx = zmq.Context()
    ctrl = ctx.socket(zmq.DEALER)
    ctrl.setsockopt(zmq.LINGER, 0)
    ctrl.connect(setup.control_addr)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.SNDHWM, 0)
    router.setsockopt(zmq.RCVHWM, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    router.bind(setup.address)
    switch = AggregationSwitch(setup.slots, setup.workers, setup.elements) if setup.aggregate else None
    ports = None
    if setup.bmv2_interfaces:
        from emu.p4.bridge import Bmv2Ports

        ports = Bmv2Ports(list(setup.bmv2_interfaces), setup.elements)
    idents = [f"h{i}".encode() for i in range(max(setup.endpoint_host) + 1)]
    endpoint_host = np.asarray(setup.endpoint_host)
    forwarded = [0, 0]  # segments, real payload bytes
    try:
        # Ready only once every host said hello: a ROUTER can route only to peers it has heard from.
        waiting = set(idents)
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while waiting:
            if not router.poll(int(max(0.0, deadline - time.monotonic()) * 1000)):
                raise FrameError(f"hosts {sorted(w.decode() for w in waiting)} never connected to the switch")
            frames = router.recv_multipart()
            if len(frames) == 2 and frames[1] == HELLO:
                waiting.discard(frames[0])
        ctrl.send(control({"type": "ready", "host": "switch"}))
        poller = zmq.Poller()
        poller.register(ctrl, zmq.POLLIN)
        poller.register(router, zmq.POLLIN)
        if ports is not None:
            for fd in ports.fileno_map():
                poller.register(fd, zmq.POLLIN)
        while True:
            events = poller.poll(200 if ports is None else 1)
            if ports is not None:
                results = ports.drain()
                if results is not None:
                    for h, part in ports.route(results, setup.worker_hosts).items():
                        router.send_multipart([idents[h], *part.frames(RESULTS)], copy=False)
            for sock, _ in events:
                if not isinstance(sock, zmq.Socket):
                    continue  # a BMv2 port: drained above
                if sock is ctrl:
                    msg = parse_control(ctrl.recv())
                    if msg["type"] == "stop":
                        stats = switch.stats.as_dict() if switch else {}
                        ctrl.send(control({"type": "switch", "stats": stats, "segments": forwarded[0],
                                           "segment_bytes": forwarded[1]}))
                        return
                    continue
                while True:
                    try:
                        frames = [f.buffer for f in router.recv_multipart(zmq.NOBLOCK, copy=False)]
                    except zmq.Again:
                        break
                    kind = bytes(frames[1])
                    if kind == AGG and ports is not None:
                        ports.submit(AggBatch.parse(frames[1:]))
                    elif kind == AGG and switch is not None:
                        _aggregate(router, switch, AggBatch.parse(frames[1:]), setup, idents)
                    elif kind == SEG and len(frames) == 5 and len(frames[2]) == P2P_HEADER.itemsize:
                        dst = int(np.frombuffer(frames[2], P2P_HEADER)["dst"][0])
                        if dst >= len(endpoint_host):
                            raise FrameError(f"segment for unknown endpoint {dst}")
                        router.send_multipart([idents[endpoint_host[dst]], *frames[1:]], copy=False)
                        forwarded[0] += 1
                        forwarded[1] += len(frames[4])
                    else:
                        raise FrameError(f"unexpected message kind {kind[:8]!r} at the switch")
    except Exception as exc:
        try:
            ctrl.send(control({"type": "error", "host": "switch", "error": f"{type(exc).__name__}: {exc}"}))
        except zmq.ZMQError:
            pass
        raise
    finally:
        if ports is not None:
            ports.close()
        ctrl.close(0)
        router.close(0)
        ctx.term()


def _aggregate(router: zmq.Socket, switch: AggregationSwitch, batch: AggBatch, setup: SwitchSetup,
               idents: list[bytes]) -> None:
    res = switch.process(batch.headers, batch.payload, batch.stamps)
    if not len(res):
        return
    dest = res.headers["worker"].astype(np.int64)
    for h, (first, last) in enumerate(setup.worker_hosts):
        mine = (dest == MULTICAST) | ((dest >= first) & (dest < last))
        if mine.all():
            part = AggBatch(res.headers, res.payload, res.stamps)
        elif mine.any():
            part = AggBatch(res.headers[mine], res.payload[mine], res.stamps[mine])
        else:
            continue
        router.send_multipart([idents[h], *part.frames(RESULTS)], copy=False)
