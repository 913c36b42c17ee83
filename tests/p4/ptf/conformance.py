"""PTF test module: the conformance vectors (tests/data/conformance) against BMv2.

Every vector's steps are sent in order: each input frame on its worker's port (port w + 1),
then every expected output frame must come out on its port, and nothing else.
``run_conformance.py`` compiles the program with the vector's pool size, starts BMv2 with
veth ports, writes the job's entries and runs this module for each vector.
"""

import json
import os

import ptf
import ptf.testutils as testutils
from ptf.base_tests import BaseTest


class Conformance(BaseTest):
    def setUp(self):
        BaseTest.setUp(self)
        self.dataplane = ptf.dataplane_instance
        self.vector = json.loads(open(os.environ["EMU_VECTOR"]).read())

    def runTest(self):
        for step in self.vector["steps"]:
            for hexframe in step["in"]:
                frame = bytes.fromhex(hexframe)
                worker = int.from_bytes(frame[42 + 4:42 + 6], "big")  # emu header's worker field
                testutils.send_packet(self, worker + 1, frame)
            for out in step["out"]:
                testutils.verify_packet(self, bytes.fromhex(out["frame"]), out["port"] + 1)
            testutils.verify_no_other_packets(self)
