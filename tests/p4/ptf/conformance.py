"""PTF test module: the conformance vectors (tests/data/conformance) against BMv2.

Every vector's steps are sent in order: each input frame on its worker's port (port w + 1), and
after each one the bridge's barrier (a FLUSH, emu/p4/bridge.py) on the same port, whose FLUSHED
copy must come back on every port before the next frame goes: BMv2 does not order frames across
ports, and the vectors pin an order (a retransmission right after the contribution that completes
its copy is answered, right before it dropped). What came out before the barriers, per port and
in order, must be the step's expected frames, and nothing else. ``run_conformance.py`` compiles
the program with the vector's pool size, starts BMv2 with veth ports, writes the job's entries and
runs this module for each vector.
"""

import json
import os

import ptf
import ptf.testutils as testutils
from ptf.base_tests import BaseTest

from emu.emulator.protocol import wire
from emu.p4.bridge import flush_frame

TYPE_AT = 42  # the emu header's first byte in a frame (Ethernet 14, IPv4 20, UDP 8)
WAIT_S = 5.0


class Conformance(BaseTest):
    def setUp(self):
        BaseTest.setUp(self)
        self.dataplane = ptf.dataplane_instance
        self.vector = json.loads(open(os.environ["EMU_VECTOR"]).read())

    def runTest(self):
        cfg = self.vector["config"]
        ports = [w + 1 for w in range(cfg["workers"])]
        seq = 0
        for number, step in enumerate(self.vector["steps"]):
            got = {p: [] for p in ports}
            for hexframe in step["in"]:
                frame = bytes.fromhex(hexframe)
                port = int.from_bytes(frame[TYPE_AT + 4:TYPE_AT + 6], "big") + 1  # the header's worker field
                port = port if port in got else ports[0]  # a worker out of range: any port
                seq += 1
                testutils.send_packet(self, port, frame)
                testutils.send_packet(self, port, flush_frame(cfg["job"], cfg["workers"], seq))
                for p in ports:
                    self._until_flushed(p, seq, got[p])
            want = {p: [] for p in ports}
            for out in step["out"]:
                want[out["port"] + 1].append(bytes.fromhex(out["frame"]))
            self.assertEqual(got, want, f"step {number} of {self.vector['name']}")
        testutils.verify_no_other_packets(self)

    def _until_flushed(self, port, seq, into):
        while True:
            res = self.dataplane.poll(port_number=port, timeout=WAIT_S)
            self.assertIsNotNone(getattr(res, "packet", None), f"no barrier {seq} back on port {port}")
            pkt = bytes(res.packet)
            if pkt[TYPE_AT] == wire.MsgType.FLUSHED and int.from_bytes(pkt[TYPE_AT + 12:TYPE_AT + 16], "big") == seq:
                return
            into.append(pkt)
