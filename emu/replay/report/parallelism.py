"""The report's ``parallelism``: how a sharded or split trace was laid out, and what each kind of
group did (docs/parallelism.md).

Per role (dp, fsdp, tp, pp, ep, other), from the programs the workers ran: how many groups, of
how many workers, spanning which dimensions of the replay's mesh; a group's collectives and a
member's bytes an iteration; how the fabric ran them; whether they stayed inside nodes; how much
the layout padded them; and every collective accounted for (each worker's completions against
its program's, over the iterations replayed).
"""

from __future__ import annotations

from collections.abc import Mapping

from emu.emulator.mechanisms import choose
from emu.replay.config.options import ReplayConfig
from emu.replay.plan.hosts import ina_pools
from emu.replay.plan.layout import MeshPlan
from emu.replay.plan.programs import WorkerProgram
from emu.replay.report.model import GroupReport, ParallelismReport
from emu.traces.mesh import Mesh
from emu.traces.model import Coll, CollKind, Trace

_P2P = (CollKind.SEND, CollKind.RECV)
_PADDED = (CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER, CollKind.ALL_TO_ALL)


def mechanism(op: Coll, config: ReplayConfig) -> str:
    """How the fabric runs a collective, in the words of the report (its mechanism's name)."""
    return choose(op, config.setting).name


def _dims(op: Coll, w: int, mesh: Mesh | None) -> tuple[str, ...]:
    """The dimensions of the replay's mesh an op's group spans (a send's: the one it crosses)."""
    if mesh is None:
        return ()
    if op.kind in _P2P:
        assert op.peer is not None
        a, b = mesh.coords(w), mesh.coords(op.peer)
        return tuple(d.name for d, x, y in zip(mesh.dims, a, b, strict=True) if x != y)
    if op.group is None:
        return mesh.names
    spans = mesh.spans(op.group)
    return tuple(mesh.dims[i].name for i in spans) if spans is not None else ()


def parallelism_report(trace: Trace, plan: MeshPlan, programs: list[WorkerProgram], config: ReplayConfig,
                       iters: int, completed: Mapping[str, int]) -> ParallelismReport:
    """``programs``: every worker's; ``completed``: the collectives the workers completed, by role."""
    by_rank = {p.rank: p for p in (plan.trace or trace).ranks}  # with the expert gradients a layout adds
    layout = config.layout()
    roles: dict[str, dict] = {}
    padded_a2a = False
    for prog in programs:
        first = prog.iterations[0]
        source = by_rank[prog.rank].iterations[0].colls
        for op, original in zip(first.colls, source, strict=True):
            role = op.group_role.value if op.group_role is not None else ""
            r = roles.setdefault(role, {"dims": set(), "groups": set(), "size": 0, "per": {}, "bytes": {}, "kinds": set(),
                                        "ran": set(), "inside": True, "padded": {}, "expected": 0})
            members = ((min(prog.worker, op.peer or 0), max(prog.worker, op.peer or 0)) if op.kind in _P2P
                       else op.group if op.group is not None else tuple(range(config.workers)))
            r["dims"].update(_dims(op, prog.worker, plan.mesh))
            r["groups"].add(members)
            r["size"] = max(r["size"], len(members))
            r["per"][(prog.worker, members)] = r["per"].get((prog.worker, members), 0) + 1
            r["bytes"][prog.worker] = r["bytes"].get(prog.worker, 0) + op.bytes
            r["kinds"].add(op.kind.value)
            r["ran"].add(mechanism(op, config))
            pad = op.count - original.count if op.kind in _PADDED and op.splits is None else 0  # uneven: resized
            padded_a2a = padded_a2a or bool(pad and op.kind == CollKind.ALL_TO_ALL)
            r["padded"][(prog.worker, members)] = r["padded"].get((prog.worker, members), 0) + pad
            if layout is not None and len({int(layout.node[m]) for m in members}) > 1:
                r["inside"] = False
            elif layout is None:
                r["inside"] = False
        for it in range(iters):
            for op in prog.iterations[it % len(prog.iterations)].colls:
                role = op.group_role.value if op.group_role is not None else ""
                roles[role]["expected"] += 1
    groups = []
    for role, r in sorted(roles.items()):
        mesh_order = plan.mesh.names if plan.mesh is not None else ()
        groups.append(GroupReport(
            role=role, dims=tuple(n for n in mesh_order if n in r["dims"]), groups=len(r["groups"]), size=r["size"],
            collectives=max(r["per"].values()), bytes=max(r["bytes"].values()), kinds=tuple(sorted(r["kinds"])),
            ran=tuple(sorted(r["ran"])), inside_nodes=bool(r["inside"]), padded_elements=max(r["padded"].values()),
            expected=r["expected"], completed=int(completed.get(role, 0))))
    notes = []
    if any(g.padded_elements for g in groups):
        kinds = "all_gathers and reduce_scatters" + (" (and even all_to_alls)" if padded_a2a else "")
        notes.append(f"{kinds} on groups that grew are padded to whole shards (as FSDP pads its parameters): "
                     "padded_elements a group an iteration")
    notes += _expert_notes(plan)
    pools, slots = ina_pools(programs, config)
    if pools:
        notes.append(f"the switch keeps a pool for the job and each of its {len(pools)} sub-groups it aggregates for: "
                     f"{slots[0][1]} slots each of the design's {config.emulated_slots}")
    for g in groups:
        if config.network.aggregates and "ring" in g.ran and "all_reduce" in g.kinds:
            notes.append(f"{g.role or 'sub-group'} all_reduces run as rings: "
                         + ("inside nodes, over the nodes' own links" if g.inside_nodes else
                            "the switch does not aggregate for sub-groups on this fabric"))
    trace_mesh = plan.trace_mesh
    return ParallelismReport(
        trace_mesh=trace_mesh.text() if trace_mesh is not None else None,
        mesh=plan.mesh.text() if plan.mesh is not None else None,
        scaled=tuple(plan.mesh.dims[i].name for i in plan.scaled) if plan.mesh is not None else (),
        kept=tuple(d.name for i, d in enumerate(plan.mesh.dims) if i not in plan.scaled) if plan.mesh is not None else (),
        groups=tuple(groups), accounted=all(g.expected == g.completed for g in groups), notes=tuple(notes))


def _expert_notes(plan: MeshPlan) -> list[str]:
    """What a mixture of experts' layout did to the trace (``emu.replay.plan.experts``)."""
    ex = plan.experts
    if ex is None:
        return []
    how = (f"routing set by --moe-imbalance {ex.imbalance:g} (one rank a step takes {ex.imbalance:g}x the mean)"
           if ex.imbalance is not None else "the trace's measured routing, tiled and reshuffled each step")
    held = f"{ex.experts_per_rank} experts a rank, " if ex.experts_per_rank is not None else ""
    what = (f"resized from ep={ex.trace_ep} to ep={ex.ep}" if ex.ep != ex.trace_ep else
            f"of each ep={ex.ep} group laid out per replica")
    notes = [f"uneven all_to_alls {what} ({held}tokens a rank kept): {how}; the compute after each dispatch "
             "follows the tokens received"]
    if plan.added:
        assert plan.mesh is not None and plan.trace is not None and plan.trace.meta.experts is not None
        names = ", ".join(plan.mesh.dims[i].name for i in plan.added)
        notes.append(f"added by emu, not in the trace: each rank's expert gradients ({ex.experts_per_rank} x "
                     f"{plan.trace.meta.experts.params_per_expert:,} elements) all-reduced over {names}, after the "
                     "iteration's last all_reduce")
    return notes
