"""A switch that can run out of packet rate (docs/topology.md, "Switch limits"): its aggregation
pipeline queues contributions in emulated time, and the report gives its utilisation."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.emulator.links.spec import LinkSpec
from emu.emulator.physics.forms import ina_pipeline_us
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.replay.config.design import parse_design
from emu.replay.jobs import Jobs, replay_jobs
from emu.study.predict import predict
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective

LINK = LinkSpec(bandwidth_bps=100e9, latency_us=5.0)
COUNT = 1 << 22


@pytest.mark.parametrize(("workers", "rate"), [pytest.param(8, 2e8, marks=pytest.mark.slow), pytest.param(8, 5e7, marks=pytest.mark.slow),
                                              pytest.param(16, 1e8, marks=pytest.mark.slow)])
def test_a_slow_pipeline_meets_its_form(workers: int, rate: float, no_children) -> None:
    """Measured: 0.0% in each case (the pipeline, not the links, sets the pace)."""
    config = ReplayConfig(workers=workers, link=LINK, packet_rate=rate)
    report = replay(single_collective(CollKind.ALL_REDUCE, COUNT), config)
    assert report.verification.ok and report.emulator.trustworthy
    form = ina_pipeline_us(COUNT, LINK, config.elements, config.emulated_slots, workers, rate)
    assert report.iterations[0].emulated_us == pytest.approx(form, rel=0.02)
    busiest = report.fabric.busiest_link
    assert busiest is not None and busiest["kind"] == "switch pipeline" and busiest["utilisation"] > 0.95
    assert predict(single_collective(CollKind.ALL_REDUCE, COUNT), config).iteration_us_median == pytest.approx(
        report.summary.iteration_us_median, rel=0.02)


@pytest.mark.slow
def test_a_fast_pipeline_changes_nothing_but_reports_its_load(no_children) -> None:
    trace = single_collective(CollKind.ALL_REDUCE, COUNT)
    free = replay(trace, ReplayConfig(workers=4, link=LINK))
    fast = replay(trace, ReplayConfig(workers=4, link=LINK, packet_rate=1e10))
    assert fast.iterations[0].emulated_us == pytest.approx(free.iterations[0].emulated_us, rel=1e-3)
    pipe = fast.fabric.utilisation["switch pipeline"]
    assert 0 < pipe.max < 0.05 and pipe.busiest == "switch"
    assert "switch pipeline" not in free.fabric.utilisation
    assert fast.config["design"]["switch"]["packet_rate"] == 1e10 and "packet_rate" not in free.config["design"]["switch"]


@pytest.mark.slow
def test_jobs_share_the_pipeline(no_children) -> None:
    """On one switch with a port a worker, two jobs share nothing but the switch: with a slow
    pipeline, each is slower than alone."""
    traces = [single_collective(CollKind.ALL_REDUCE, COUNT), single_collective(CollKind.ALL_REDUCE, COUNT)]
    report = replay_jobs(traces, ReplayConfig(link=LINK, packet_rate=1e8, iters=2), Jobs((4, 4)), ["a", "b"])
    assert report.verification.ok and report.jobs is not None
    assert all(j.slowdown is not None and j.slowdown > 1.5 for j in report.jobs)


def test_refusals_and_the_design_key() -> None:
    with pytest.raises(ConfigError, match="synchronized clock"):
        ReplayConfig(link=LINK, packet_rate=1e9, clock=None, tdf=5.0).check()
    with pytest.raises(ConfigError, match="1 to 1e13"):
        ReplayConfig(packet_rate=0.5).check()
    assert parse_design('[switch]\npacket_rate = "1.2Gpps"\n', "d.toml").value("switch.packet_rate") == 1.2e9
    assert parse_design("[switch]\npacket_rate = 5e8\n", "d.toml").value("switch.packet_rate") == 5e8
    with pytest.raises(ConfigError, match="d.toml: switch.packet_rate"):
        parse_design('[switch]\npacket_rate = "fast"\n', "d.toml")


def test_the_cli_flag(no_children) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["replay", "mlp", "--workers", "4", "--iters", "1", "--packet-rate", "500Mpps", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["config"]["design"]["switch"]["packet_rate"] == 5e8
    assert "switch pipeline" in doc["fabric"]["utilisation"]
    bad = runner.invoke(cli, ["replay", "mlp", "--packet-rate", "fast"])
    assert bad.exit_code == 2 and "--packet-rate 'fast'" in bad.output
