"""The P4 program and the Python wire format: one header definition, checked from the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from emu.emulator.protocol import wire
from emu.errors import ConfigError
from emu.p4 import bmv2, generate
from emu.p4.entries import FLUSH_GROUP, MAX_WORKERS, JobEntry, MulticastGroup, Replica, plan
from emu.replay.config.options import MIN_POOL

SOURCE = generate.PROGRAM.read_text()


def header_fields(name: str) -> list[tuple[str, int]]:
    body = re.search(rf"header {name} {{(.*?)}}", SOURCE, re.S)
    assert body, f"header {name} not found in {generate.PROGRAM.name}"
    return [(f, int(bits)) for bits, f in re.findall(r"bit<(\d+)>\s+(\w+);", body.group(1))]


def test_checked_in_program_is_current() -> None:
    assert SOURCE == generate.render(), "regenerate with: python -m emu.p4.generate"


def test_emu_header_matches_the_wire_format() -> None:
    assert header_fields("emu_h") == [(name, bits) for name, _, bits in wire.AGG_FIELDS]
    assert sum(bits for _, bits in header_fields("emu_h")) == 8 * wire.AGG_HEADER.itemsize


def test_payload_and_constants_match_emu() -> None:
    payload = header_fields("payload_t")
    assert len(payload) == wire.ELEMENTS_DEFAULT and all(bits == 32 for _, bits in payload)
    assert re.search(rf"const bit<16> UDP_PORT = 0x{wire.UDP_PORT:04X};", SOURCE)
    assert re.search(rf"#define EMU_SLOTS {MIN_POOL}\b", SOURCE)
    assert "MSG_CONTRIB = 1" in SOURCE and "MSG_RESULT = 2" in SOURCE
    assert wire.MsgType.CONTRIB == 1 and wire.MsgType.RESULT == 2


def test_headers_of_the_frame_template() -> None:
    assert [b for _, b in header_fields("ethernet_t")] == [48, 48, 16]
    assert sum(b for _, b in header_fields("ipv4_t")) == 8 * wire.IPV4_HEADER
    assert sum(b for _, b in header_fields("udp_t")) == 8 * wire.UDP_HEADER


def test_every_register_update_is_one_action() -> None:
    # each accumulator is read and written in the same action, and all of them in one (BMv2 runs
    # every action called from apply as a table: one table, not 64, a packet)
    action = re.search(r"action accumulate\(\) {(.*?)\n    }\n", SOURCE, re.S).group(1)
    for i in range(wire.ELEMENTS_DEFAULT):
        assert f"acc{i}.read(a, meta.idx)" in action and f"acc{i}.write(meta.idx, a)" in action
    assert SOURCE.count("accumulate();") == 1 and SOURCE.count("read_sums();") == 1


def test_entries_plan() -> None:
    p = plan(3, [1, 2, 5])
    assert p.jobs == (JobEntry(job=3, num_workers=3, mcast_grp=4),)
    replicas = (Replica(1, 0), Replica(2, 1), Replica(5, 2))
    assert p.groups == (MulticastGroup(group=4, replicas=replicas), MulticastGroup(group=FLUSH_GROUP, replicas=replicas))
    with pytest.raises(ConfigError, match="1 to 32 workers"):
        plan(0, list(range(MAX_WORKERS + 1)))
    with pytest.raises(ConfigError, match="its own switch port"):
        plan(0, [1, 1])


def test_bmv2_missing_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(bmv2.shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="p4c-bm2-ss and simple_switch_grpc, not found on PATH; build p4c"):
        bmv2.check_available()


def test_bmv2_is_started_at_the_device_id_p4runtime_asks_for() -> None:
    """finsy's default device id is 1, simple_switch_grpc's 0: the pipeline was refused
    ("Error when trying to assign device") until both were given bmv2.DEVICE_ID."""
    cmd = bmv2.switch_command(["-i", "1@emu-s0"], "127.0.0.1:9559")
    at = cmd.index("--device-id")
    assert int(cmd[at + 1]) == bmv2.DEVICE_ID and at < cmd.index("--")
    fy = pytest.importorskip("finsy", reason="finsy is not installed (pip install 'emu[p4]')")
    from emu.p4 import control

    compiled = bmv2.Compiled(bmv2_json=Path("emu_agg.json"), p4info=Path("emu_agg.p4info.txtpb"))
    assert control.switch_options(fy, compiled, None).device_id == bmv2.DEVICE_ID


def test_a_switch_that_dies_at_start_is_one_line_naming_its_log(tmp_path) -> None:
    log = tmp_path / "simple_switch.log"
    with open(log, "wb") as out:
        proc = bmv2.subprocess.Popen(["sh", "-c", "echo 'Error when trying to assign device'; exit 3"],
                                     stdout=out, stderr=bmv2.subprocess.STDOUT)
        with pytest.raises(ConfigError, match=f"exited with code 3 at start; its log: {re.escape(str(log))}"):
            bmv2._wait_port(bmv2._free_port(), 5.0, proc, log)
    assert "assign device" in log.read_text()
