"""Replays on a topology (docs/topology.md): real traffic through shared NICs, node-internal
ports and a spine, checked against the closed forms of docs/physics.md ('On a topology')."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from emu.cli import cli
from emu.emulator.links.spec import LinkSpec
from emu.emulator.links.topology import Hierarchy, Placement, Topology
from emu.emulator.physics.topology import topology_hier_ring_us, topology_ina_us, topology_ps_us, topology_ring_us
from emu.errors import ConfigError
from emu.replay import ReplayConfig, replay
from emu.study.predict import predict
from emu.traces.model import CollKind
from emu.traces.synthetic import single_collective

LINK = LinkSpec(bandwidth_bps=100e9, latency_us=5.0)
M = 8


def _time(fabric: str, count: int, topo: Topology | None,
          workers: int = M) -> tuple[float, float, ReplayConfig, object]:
    trace = single_collective(CollKind.ALL_REDUCE, count)
    config = ReplayConfig(workers=workers, fabric=fabric, link=LINK, topology=topo)
    report = replay(trace, config)
    assert report.verification.ok and report.emulator.trustworthy
    lay = config.layout()
    if fabric == "ring" and topo is not None and topo.algorithm == Hierarchy.HIERARCHICAL:
        formula = topology_hier_ring_us(count, 4, LINK, topo, lay, payload_scale=report.emulator.payload_scale)
    elif fabric == "ring":
        formula = topology_ring_us(count, 4, LINK, topo, lay, payload_scale=report.emulator.payload_scale)
    elif fabric == "ps":
        formula = topology_ps_us(count, 4, LINK, topo, lay, config.shards, report.emulator.payload_scale)
    else:
        formula = topology_ina_us(count, LINK, topo, lay, config.elements, config.emulated_slots)
    return report.iterations[0].emulated_us, formula, config, report


@pytest.mark.parametrize("topo", [
    Topology(workers_per_node=4),  # packed: one ring hop a NIC, the rest inside nodes
    Topology(workers_per_node=4, placement=Placement.SPREAD),  # every hop between nodes: 4 a NIC
    pytest.param(Topology(workers_per_node=4, nics_per_node=2, placement=Placement.SPREAD),  # 2 a NIC
                 marks=pytest.mark.slow),
    Topology(workers_per_node=2, leaf_ports=1, placement=Placement.RANDOM),  # 4 leaves and a spine
    pytest.param(Topology(workers_per_node=8), marks=pytest.mark.slow),  # one node: the ring never leaves it
    pytest.param(Topology(workers_per_node=1, leaf_ports=4, oversubscription=2, placement=Placement.RANDOM),
                 marks=pytest.mark.slow),
    pytest.param(Topology(workers_per_node=1, leaf_ports=4, oversubscription=4, placement=Placement.RANDOM),
                 marks=pytest.mark.slow),
    pytest.param(Topology(workers_per_node=2, leaf_ports=4, oversubscription=4, placement=Placement.SPREAD),
                 marks=pytest.mark.slow),
], ids=["packed", "spread", "spread-2nics", "random-4leaves", "one-node", "random-2to1", "random-4to1",
        "spread-4to1"])
def test_a_ring_on_a_topology_meets_its_formula(topo: Topology, no_children) -> None:
    """Measured (docs/physics.md, "On a topology"): 0.0% but random placement behind
    oversubscribed leaves, +1.5% at 4:1 and +2.5% at 2:1, which alone is held to 3%."""
    workers = M if topo.oversubscription == 1 else 16
    emulated, formula, _, _ = _time("ring", 1 << 24, topo, workers)
    random_2to1 = topo.placement == Placement.RANDOM and topo.oversubscription == 2
    assert emulated == pytest.approx(formula, rel=0.03 if random_2to1 else 0.02)


@pytest.mark.parametrize("topo", [
    pytest.param(Topology(workers_per_node=4), marks=pytest.mark.slow),  # four streams share each NIC
    Topology(workers_per_node=2, leaf_ports=1),  # two a NIC, and the spine aggregates
    pytest.param(Topology(workers_per_node=2, leaf_ports=2, oversubscription=4),  # the leaves' uplinks set the pace
                 marks=pytest.mark.slow),
    pytest.param(Topology(workers_per_node=2, leaf_ports=2, oversubscription=4, algorithm=Hierarchy.HIERARCHICAL),
                 marks=pytest.mark.slow),
], ids=["4-a-nic", "spine", "4to1", "4to1-hierarchical"])
def test_ina_on_a_topology_meets_its_formula(topo: Topology, no_children) -> None:
    emulated, formula, _, _ = _time("ina", 1 << 22, topo)
    assert emulated == pytest.approx(formula, rel=0.02)


@pytest.mark.parametrize("topo", [
    pytest.param(Topology(workers_per_node=4), marks=pytest.mark.slow),  # four workers push and pull through each NIC
    pytest.param(Topology(workers_per_node=4, nics_per_node=2, placement=Placement.SPREAD),  # two a NIC
                 marks=pytest.mark.slow),
    pytest.param(Topology(workers_per_node=2, leaf_ports=1), marks=pytest.mark.slow),  # the shards hang off the spine
    pytest.param(Topology(workers_per_node=1, leaf_ports=4, oversubscription=2), marks=pytest.mark.slow),
    Topology(workers_per_node=2, leaf_ports=4, oversubscription=4),  # the leaves' uplinks set the pace
    pytest.param(Topology(workers_per_node=1, leaf_ports=8, oversubscription=32),  # the last sums queue down the leaf
                 marks=pytest.mark.slow),
], ids=["4-a-nic", "spread-2nics", "spine", "2to1", "4to1", "32to1"])
def test_a_parameter_server_on_a_topology_meets_its_formula(topo: Topology, no_children) -> None:
    """Measured: 0.0% but at 2:1 (+0.8%) and 32:1 (-1.6%), where the leaf's links are loaded both ways."""
    workers = M if topo.oversubscription == 1 else 16
    emulated, formula, _, _ = _time("ps", 1 << 22, topo, workers)
    assert emulated == pytest.approx(formula, rel=0.02)


@pytest.mark.slow
def test_one_worker_a_node_is_the_one_switch(no_children) -> None:
    """Nodes of one worker on one leaf are exactly today's network: the same times."""
    for fabric in ("ina", "ring", "ps"):
        flat = replay(single_collective(CollKind.ALL_REDUCE, 1 << 18), ReplayConfig(workers=M, fabric=fabric, link=LINK))
        noded, _, _, _ = _time(fabric, 1 << 18, Topology(workers_per_node=1))
        assert noded == flat.iterations[0].emulated_us


@pytest.mark.slow  # 5 s; make test keeps the topology formulas and the layout identity
def test_packing_keeps_the_ring_off_the_nics(no_children) -> None:
    """Packed, only the hops between nodes cross NICs: a quarter of the flat ring's bytes there,
    and spread, every hop and four times the load on each NIC."""
    _, _, _, packed = _time("ring", 1 << 20, Topology(workers_per_node=4))
    _, _, _, spread = _time("ring", 1 << 20, Topology(workers_per_node=4, placement=Placement.SPREAD))
    flat = replay(single_collective(CollKind.ALL_REDUCE, 1 << 20), ReplayConfig(workers=M, fabric="ring", link=LINK))
    assert packed.summary.bytes_sent == pytest.approx(flat.summary.bytes_sent / 4, rel=1e-6)
    assert spread.summary.bytes_sent == pytest.approx(flat.summary.bytes_sent, rel=1e-6)
    assert spread.iterations[0].emulated_us > 3 * packed.iterations[0].emulated_us


@pytest.mark.slow
def test_a_shipped_trace_replays_on_every_fabric(no_children) -> None:
    from emu.traces import load_trace, sample_path

    trace = load_trace(sample_path("mlp"))
    topo = Topology(workers_per_node=4, leaf_ports=2, placement=Placement.SPREAD, oversubscription=2)
    for fabric in ("ina", "ring", "ps"):
        report = replay(trace, ReplayConfig(workers=16, fabric=fabric, link=LINK, topology=topo, iters=1))
        assert report.verification.ok and report.emulator.trustworthy, fabric
        assert report.config["design"]["topology"]["placement"] == "spread"


@pytest.mark.parametrize(("fabric", "topo"), [
    pytest.param("ina", Topology(workers_per_node=8), marks=pytest.mark.slow),  # 28 s here
    pytest.param("ring", Topology(workers_per_node=8, placement=Placement.SPREAD), marks=pytest.mark.slow),
    pytest.param("ina", Topology(workers_per_node=8, nics_per_node=8, leaf_ports=16, oversubscription=4,
                                 algorithm=Hierarchy.HIERARCHICAL), marks=pytest.mark.slow),
], ids=["ina-shared-nic", "ring-spread", "ina-hierarchical-4to1"])
def test_predict_on_a_topology_follows_the_replay(fabric: str, topo: Topology, no_children) -> None:
    """emu predict's schedule over the topology forms lands within 3% of the replay of the shipped
    mlp at 32 workers (measured: -0.4%, +1.9%, 0.0%)."""
    from emu.traces import load_trace, sample_path

    trace = load_trace(sample_path("mlp"))
    config = ReplayConfig(workers=32, fabric=fabric, link=LINK, topology=topo, iters=2)
    assert predict(trace, config).iteration_us_median == pytest.approx(
        replay(trace, config).summary.iteration_us_median, rel=0.03)


def test_predict_refuses_what_its_topology_forms_do_not_cover() -> None:
    trace = single_collective(CollKind.ALL_REDUCE, 1 << 10)
    topo = Topology(workers_per_node=4)
    with pytest.raises(ConfigError, match="a parameter server on a topology"):
        predict(trace, ReplayConfig(workers=M, fabric="ps", topology=topo))
    with pytest.raises(ConfigError, match="loss or jitter on a topology"):
        predict(trace, ReplayConfig(workers=M, link=LinkSpec(loss=0.01), topology=topo))
    with pytest.raises(ConfigError, match="broadcast of float32 by the binomial tree on a topology"):
        predict(single_collective(CollKind.BROADCAST, 1 << 10), ReplayConfig(workers=M, topology=topo))


@pytest.mark.slow
def test_cli_flags_and_design_file(tmp_path, no_children) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["replay", "mlp", "--workers", "8", "--fabric", "ring", "--iters", "1",
                              "--workers-per-node", "4", "--placement", "1,0,1,0,1,0,1,0", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["config"]["design"]["topology"]["placement"] == [1, 0, 1, 0, 1, 0, 1, 0]
    design = tmp_path / "nodes.toml"
    design.write_text('fabric = "ina"\n[topology]\nworkers_per_node = 4\nplacement = "spread"\n')
    res = runner.invoke(cli, ["replay", "mlp", "--workers", "8", "--iters", "1", "--network", str(design),
                              "--placement", "packed", "--json"])
    assert res.exit_code == 0, res.output
    topo = json.loads(res.stdout)["config"]["design"]["topology"]
    assert (topo["workers_per_node"], topo["placement"]) == (4, "packed")  # the typed flag wins
    res = runner.invoke(cli, ["replay", "mlp", "--workers", "8", "--fabric", "ps", "--algorithm", "hierarchical"])
    assert res.exit_code == 2 and "no hierarchical variant" in res.output
    res = runner.invoke(cli, ["replay", "mlp", "--workers", "8", "--placement", "sideways"])
    assert res.exit_code == 2 and "--placement" in res.output


@pytest.mark.slow
def test_the_report_names_the_busiest_link(no_children) -> None:
    """Utilisation is each link's serialization over the emulated span: on the one switch a ring's
    uplinks carry half the bytes on the wire between them; flat INA at 4:1 is bound by its
    leaves' links to the spine."""
    trace = single_collective(CollKind.ALL_REDUCE, 1 << 20)
    flat = replay(trace, ReplayConfig(workers=M, fabric="ring", link=LINK))
    up = flat.fabric.utilisation["uplink"]
    span = flat.iterations[0].emulated_us
    assert up.links == M and up.mean * span * M * LINK.bandwidth_bps / 8e6 == pytest.approx(
        flat.summary.bytes_sent / 2, rel=1e-6)
    _, _, _, over = _time("ina", 1 << 20, Topology(workers_per_node=2, leaf_ports=2, oversubscription=4))
    busiest = over.fabric.busiest_link
    assert busiest["kind"] == "leaf to spine" and busiest["utilisation"] > 0.9
    assert set(over.fabric.utilisation) == {"NIC up", "NIC down", "node port up", "node port down", "leaf to spine",
                                            "spine to leaf"}


@pytest.mark.slow
def test_hierarchical_ina_sends_one_partial_sum_a_leaf(no_children) -> None:
    """At 4:1 the flat stream's leaf links carry all four of a leaf's streams and set the pace; the
    leaves' partial sums take a quarter of that, and the NICs set the pace again. With loss the
    leaf waits for retransmitted contributions and lets late duplicates through: the replay ends,
    every sum exact."""
    flat, _, _, _ = _time("ina", 1 << 20, Topology(workers_per_node=2, leaf_ports=2, oversubscription=4))
    hier, _, _, report = _time("ina", 1 << 20, Topology(workers_per_node=2, leaf_ports=2, oversubscription=4,
                                                        algorithm=Hierarchy.HIERARCHICAL))
    assert hier < flat / 3 and report.fabric.busiest_link["kind"].startswith("NIC")
    lossy = ReplayConfig(workers=M, fabric="ina", link=LinkSpec(bandwidth_bps=100e9, latency_us=5.0, loss=0.01),
                         topology=Topology(workers_per_node=2, leaf_ports=1, algorithm=Hierarchy.HIERARCHICAL))
    report = replay(single_collective(CollKind.ALL_REDUCE, 1 << 18, iterations=2), lossy)
    assert report.verification.ok and report.fabric.packets_lost > 0 and report.emulator.trustworthy


@pytest.mark.parametrize("topo", [
    pytest.param(Topology(workers_per_node=4, algorithm=Hierarchy.HIERARCHICAL), marks=pytest.mark.slow),
    pytest.param(Topology(workers_per_node=4, placement=Placement.SPREAD, algorithm=Hierarchy.HIERARCHICAL),
                 marks=pytest.mark.slow),
    pytest.param(Topology(workers_per_node=8, algorithm=Hierarchy.HIERARCHICAL), marks=pytest.mark.slow),
    Topology(workers_per_node=2, leaf_ports=2, oversubscription=4, algorithm=Hierarchy.HIERARCHICAL),
], ids=["packed", "spread", "one-node", "4to1"])
def test_a_hierarchical_ring_meets_its_formula(topo: Topology, no_children) -> None:
    """Reduce to each node's leader, a ring of the leaders, broadcast inside: placement no longer
    matters, and every worker checks the whole sum it ends with."""
    workers = 8 if topo.workers_per_node == 8 else 16
    emulated, formula, _, report = _time("ring", 1 << 24, topo, workers)
    assert emulated == pytest.approx(formula, rel=0.02)
    assert report.verification.elements_checked == workers * (1 << 24) // report.emulator.payload_scale


def test_a_report_does_not_depend_on_the_process_layout(no_children) -> None:
    """Segments that reach a leaf's link at the same time from different hosts are handed over in
    an order fixed by what they are, not by which message reached the switch first."""
    trace = single_collective(CollKind.ALL_REDUCE, 1 << 18, iterations=2)
    topo = Topology(workers_per_node=2, leaf_ports=1, placement=Placement.LIST, nodes=(0, 1, 2, 1))
    docs = []
    for processes in (1, 3, 3, 3):
        report = replay(trace, ReplayConfig(workers=4, fabric="ring", link=LINK, topology=topo, processes=processes))
        docs.append(json.dumps({k: v for k, v in report.to_dict().items() if k not in ("emulator", "config")},
                               sort_keys=True))
    assert len(set(docs)) == 1


def test_utilisation_is_busy_time_under_a_bandwidth_schedule_too(no_children) -> None:
    """A link that runs at 25 Gb/s from the start is as busy whether the schedule says so or it
    was 100 Gb/s for the first microsecond."""
    trace = single_collective(CollKind.ALL_REDUCE, 1 << 20)
    plain = replay(trace, ReplayConfig(workers=4, fabric="ring", link=LinkSpec(bandwidth_bps=25e9, latency_us=5.0)))
    stepped = replay(trace, ReplayConfig(workers=4, fabric="ring", link=LinkSpec(
        bandwidth_bps=100e9, latency_us=5.0, schedule=((0.0, 100e9), (1.0, 25e9)))))
    assert stepped.fabric.utilisation["uplink"].max == pytest.approx(plain.fabric.utilisation["uplink"].max, rel=0.02)


def test_topology_errors_name_where_the_topology_came_from(tmp_path) -> None:
    design = tmp_path / "bad.toml"
    design.write_text("[topology]\nworkers_per_node = 2\nnics_per_node = 4\n")
    res = CliRunner().invoke(cli, ["replay", "mlp", "--network", str(design)])
    assert res.exit_code == 2 and f"{design} (with any topology flag typed beside it): topology.nics_per_node = 4" in res.output.replace("\n", "")
    res = CliRunner().invoke(cli, ["replay", "mlp", "--workers", "4", "--placement", "0,0,1"])
    assert res.exit_code == 2 and "the topology flags: topology.placement lists 3 nodes for 4 workers" in res.output
