"""Several jobs sharing one fabric (docs/topology.md, "Several jobs"): each with its own pool,
collectives and verification, sharing the switch and the leaves' links; each also replayed alone."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Allocation, Hierarchy, Placement, Topology
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.replay.config.design import parse_design
from emu.replay.jobs import Jobs, replay_jobs
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective

LINK = LinkSpec(bandwidth_bps=100e9, latency_us=5.0)
# two nodes of 2 workers a leaf (a NIC each), leaves at 4:1: jobs that share a leaf share its link
SHARED_SPINE = Topology(workers_per_node=2, nics_per_node=2, leaf_ports=4, oversubscription=4.0)


def _traces(count: int = 1 << 20, kind: CollKind = CollKind.ALL_REDUCE) -> list:
    return [single_collective(kind, count), single_collective(kind, count // 2)]


@pytest.mark.slow
@pytest.mark.parametrize("fabric", ["ina", "ring", "ps"])
def test_jobs_that_share_nothing_take_their_time_alone_exactly(fabric: str, no_children) -> None:
    """One switch, a port a worker: nothing is shared but the switch, whose pool each job has its
    share of, so each job's time is exactly its replay alone, and every element of both is checked."""
    traces = _traces()
    config = ReplayConfig(fabric=fabric, link=LINK, iters=3)  # job 1 runs twice as fast: 1 iteration of job 0 overlaps
    report = replay_jobs(traces, config, Jobs((4, 3)), ["a", "b"])
    assert report.jobs is not None and len(report.jobs) == 2
    assert report.verification.ok and report.emulator.trustworthy
    checked = 0
    for job, trace, m in zip(report.jobs, traces, (4, 3), strict=True):
        assert job.workers == m and job.verification.ok and job.summary is not None
        # the same iterations: equal but for the last digits (the clock's windows, and so the order of
        # floating-point sums, differ with a neighbour)
        assert job.slowdown == pytest.approx(1.0, rel=1e-12) and job.alone_us == pytest.approx(job.shared_us, rel=1e-12)
        assert job.overlapped == (1 if job.job == 0 else 3)
        # alone is the job's own replay, with its seed and share of the pool
        cfg = replace(config, workers=m, seed=job.job, slots=job.slots, payload_scale=report.emulator.payload_scale)
        solo = replay(trace, cfg)
        assert statistics.median(it.emulated_us for it in solo.iterations[:job.overlapped]) == pytest.approx(
            job.alone_us, rel=1e-12)
        assert solo.verification.elements_checked == job.verification.elements_checked
        checked += job.verification.elements_checked
    assert report.verification.elements_checked == checked > 0
    assert report.config["jobs"]["workers"] == [4, 3] and report.config["workers"] == 7
    assert report.iterations == report.jobs[0].iterations  # the top is job 0's


# ina's is the slowest to replay (40 s here), ps's 18 s: the default run keeps ring's
@pytest.mark.parametrize("fabric", [pytest.param("ina", marks=pytest.mark.slow), pytest.param("ring", marks=pytest.mark.slow),
                                    pytest.param("ps", marks=pytest.mark.slow)])
def test_jobs_sharing_oversubscribed_leaves_slow_each_other(fabric: str, no_children) -> None:
    """Interleaved, each job holds a node on each leaf, so both jobs' traffic between leaves queues
    on the same 4:1 links: both are slower than alone. Contiguous, each job holds its own leaf: the
    leaves' links carry one job each and nothing slows down."""
    traces = _traces(1 << 21)
    config = ReplayConfig(fabric=fabric, link=LINK, topology=SHARED_SPINE, iters=3)
    shared = replay_jobs(traces, config, Jobs((4, 4), Allocation.INTERLEAVED), ["a", "b"])
    assert shared.verification.ok and shared.jobs is not None
    assert [j.nodes for j in shared.jobs] == [[0, 2], [1, 3]]
    assert all(j.slowdown is not None and j.slowdown > 1.05 for j in shared.jobs)
    assert shared.fabric.busiest_link is not None and shared.fabric.busiest_link["kind"] == "leaf to spine"
    apart = replay_jobs(traces, config, Jobs((4, 4), Allocation.CONTIGUOUS), ["a", "b"])
    assert apart.jobs is not None and [j.nodes for j in apart.jobs] == [[0, 1], [2, 3]]
    assert [j.slowdown for j in apart.jobs] == pytest.approx([1.0, 1.0], rel=1e-12)


@pytest.mark.slow  # 50 s here; tests/replay/test_clock.py checks one job's replay across layouts by default
def test_a_shared_replay_is_the_same_on_any_process_layout(no_children) -> None:
    """Hierarchical INA: a leaf sums each job's workers apart (its partial is per job and chunk)."""
    topo = replace(SHARED_SPINE, nics_per_node=1, leaf_ports=2, algorithm=Hierarchy.HIERARCHICAL)
    traces = _traces(1 << 20)
    reports = [replay_jobs(traces, ReplayConfig(link=LINK, topology=topo, processes=p, iters=2),
                           Jobs((6, 4), Allocation.INTERLEAVED), ["a", "b"]) for p in (1, 3)]
    assert reports[0].emulator.processes != reports[1].emulator.processes
    for r in reports:
        assert r.verification.ok and r.jobs is not None and all(j.slowdown and j.slowdown > 1 for j in r.jobs)
    one, three = ([(j.shared_us, j.summary.bytes_sent, j.alone_us) for j in r.jobs] for r in reports)
    assert one == three
    assert reports[0].fabric.utilisation == reports[1].fabric.utilisation


def test_nodes_are_handed_out_whole() -> None:
    topo = Topology(workers_per_node=4, placement=Placement.SPREAD)
    config = ReplayConfig(workers=14, topology=topo)
    nodes, fabric_nodes = Jobs((6, 8), Allocation.CONTIGUOUS).nodes(config)  # type: ignore[misc]
    assert fabric_nodes == 4
    assert nodes[0].tolist() == [0, 1, 0, 1, 0, 1] and nodes[1].tolist() == [2, 3] * 4  # spread over its own
    nodes, _ = Jobs((6, 8), Allocation.INTERLEAVED).nodes(config)  # type: ignore[misc]
    assert set(nodes[0].tolist()) == {0, 2} and set(nodes[1].tolist()) == {1, 3}
    configs = Jobs((6, 8)).configs(config)
    assert [c.workers for c in configs] == [6, 8] and [c.seed for c in configs] == [0, 1]
    assert all(c.topology is not None and c.topology.fabric_nodes == 4 for c in configs)
    assert configs[0].emulated_slots + configs[1].emulated_slots <= config.emulated_slots
    listed = replace(topo, placement=Placement.LIST, nodes=(0, 0, 1, 1, 1, 1))
    with pytest.raises(ConfigError, match="jobs 0 and 1 on node 1"):
        Jobs((3, 3)).nodes(replace(config, workers=6, topology=listed))
    # a job alone on one of several leaves still crosses the spine, as it does shared
    lay = configs[1].layout()
    assert lay is not None and lay.leaves == Topology(workers_per_node=4).layout(16).leaves


def test_refusals(no_children) -> None:
    traces = _traces()
    with pytest.raises(ConfigError, match="synchronized clock"):
        replay_jobs(traces, ReplayConfig(tdf=10.0), Jobs((2, 2)))
    with pytest.raises(ConfigError, match="one --workers value per trace"):
        replay_jobs(traces, ReplayConfig(), Jobs((2, 2, 2)))
    with pytest.raises(ConfigError, match="at least one slot a job"):
        replay_jobs(traces, ReplayConfig(slots=1), Jobs((2, 2)))


@pytest.mark.slow
def test_the_cli_replays_jobs_and_reports_them(tmp_path, no_children) -> None:
    runner = CliRunner()
    report = tmp_path / "r.json"
    # a table wide enough for its headers whatever the test runner sets (pytest-xdist: COLUMNS=80)
    result = runner.invoke(cli, ["replay", "mlp", "mlp", "--workers", "2,2", "--iters", "1",
                                 "--report", str(report)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "2 jobs sharing the fabric" in result.output and "slowdown" in result.output
    doc = json.loads(report.read_text())
    assert [j["workers"] for j in doc["jobs"]] == [2, 2] and doc["jobs"][0]["slowdown"] == pytest.approx(1.0)
    assert doc["jobs"][1]["trace"]["sha256"] == doc["trace"]["sha256"]
    assert len(doc["jobs"][0]["iterations"]) == 1
    bad = runner.invoke(cli, ["replay", "mlp", "mlp", "--workers", "2,2,2"])
    assert bad.exit_code == 2 and "3 counts for 2 traces" in bad.output
    alone = runner.invoke(cli, ["replay", "mlp", "--allocation", "interleaved"])
    assert alone.exit_code == 2 and "several traces" in alone.output


def test_a_design_says_how_jobs_share() -> None:
    design = parse_design('[jobs]\nallocation = "interleaved"\nslot_policy = "static"\n', "d.toml")
    assert design.value("jobs.allocation") == Allocation.INTERLEAVED
    with pytest.raises(ConfigError, match='d.toml: jobs.allocation = .*"contiguous" or "interleaved"'):
        parse_design('[jobs]\nallocation = "random"\n', "d.toml")
    with pytest.raises(ConfigError, match=r"unknown key jobs\.traces"):
        parse_design('[jobs]\ntraces = ["a"]\n', "d.toml")


@pytest.mark.slow
def test_bytes_on_the_leaves_links_are_each_jobs_own(no_children) -> None:
    traces = _traces(1 << 21)
    config = ReplayConfig(fabric="ring", link=LINK, topology=SHARED_SPINE)
    report = replay_jobs(traces, config, Jobs((4, 4), Allocation.INTERLEAVED), ["a", "b"])
    assert report.jobs is not None
    sent = [j.summary.bytes_sent for j in report.jobs if j.summary is not None]
    assert sent[0] == pytest.approx(2 * sent[1], rel=0.02)  # job 1 all-reduces half as much
    assert np.isfinite(sent).all()
