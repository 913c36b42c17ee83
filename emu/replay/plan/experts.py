"""A mixture of experts at a new expert-parallel size: ``--mesh dp=D,ep=E`` of a trace whose mesh is
``ep=E0`` (docs/moe.md, "The rule").

**Experts per rank.** The trace's expert-parallel group of E0 ranks holds ``meta.experts.count``
(X) experts, X/E0 a rank. At ``ep=E`` each rank holds X/E: E must be a multiple of E0 that divides
X (the sample's 16 experts over 4, 8 or 16 ranks). More ranks than experts would replicate experts
and add a gradient group across ep that is not a slice of the mesh, so it is refused.

**Tokens per rank stay** (weak scaling, as data-parallel replicas keep their batch): what a rank
sends in an all_to_all adds up to what its trace rank sent, spread over E peers.

- *Measured imbalance* (the default): the k-th trace iteration's exchange matrix (what position r of
  the trace's group sent position s in its a-th uneven all_to_all) is tiled. Position j of a
  replay's expert-parallel group stands for trace position ``c(j)``, where ``c`` holds each trace
  position E/E0 times in an order drawn per iteration and group (seeded by ``--seed``), and sends
  position i ``M[c(j)][c(i)] x E0/E`` elements, rounded. Every position sends and receives what its
  trace position did, and every step's largest split over its mean is the trace's: the measured
  imbalance kept as the workers grow. (A real router spread over more ranks, each with fewer
  experts, is more uneven than that; ``--moe-imbalance`` sets it.)
- ``--moe-imbalance F``: per iteration and group one position (drawn, seeded) receives F times the
  mean of a dispatch and the others share the rest evenly: a dispatch from j sends position i
  ``T_j x w_i / E`` (``T_j`` what trace position c(j) sent in it, ``w`` those loads, mean 1), and a
  combine (the tokens' way back) the transpose: ``T'_i x w_j / E``. F = 1 is balanced routing.

A *dispatch* is an uneven all_to_all whose receives are more uneven than its sends (tokens, or in the
backward pass their gradients, going to their experts); a *combine* is the way back.

**Expert compute follows the tokens:** the compute between a dispatch and the next collective is
scaled by what the position received over what its program's trace rank received in it.

**Expert gradients:** where the replay adds a data-parallel dimension the trace lacks (``dp=8`` to an
``ep=4`` trace), each rank's expert gradients are all-reduced over it: one all_reduce of
X/E x ``meta.experts.params_per_expert`` elements of ``meta.dtype`` after the iteration's last
all_reduce, waited with it (the trace's ranks held distinct experts and issued none). It is the one
collective a replay adds to a trace, and the report's parallelism notes say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from emu.errors import ConfigError
from emu.traces.model import Coll, CollKind, Compute, Dtype, GroupRole, Op, RankProgram, Splits, Trace, Wait


def ep_problem(trace: Trace, trace_ep: int, ep: int) -> str | None:
    """Why the trace's expert-parallel dimension cannot take ``ep`` ranks, or None."""
    experts = trace.meta.experts
    if experts is None:
        return ("the trace records no meta.experts (how many experts, and one expert's parameters), so emu "
                "cannot say what each rank holds at another size; emu capture --model moe records it, or add "
                '"experts": {"count": X, "params_per_expert": P} to the trace\'s meta')
    if experts.count % trace_ep:
        return (f"meta.experts.count is {experts.count}, which does not divide over the trace's {trace_ep} "
                "expert-parallel ranks; give the experts the capture's ranks held, all of them")
    if ep % trace_ep or experts.count % ep:
        return (f"the trace's {experts.count} experts over {trace_ep} ranks replay over a multiple of {trace_ep} "
                f"that divides {experts.count}: " + ", ".join(str(e) for e in range(trace_ep, experts.count + 1)
                                                            if e % trace_ep == 0 and experts.count % e == 0))
    return None


@dataclass(frozen=True)
class _Exchange:
    """One uneven all_to_all of a trace iteration over its group: ``sent[r, s]`` the elements position
    r sent position s."""

    sent: np.ndarray
    dispatch: bool


def _exchange(rows: list[Splits]) -> _Exchange:
    sent = np.array([sp.send_elements for sp in rows], dtype=np.int64)
    outs, ins = sent.sum(axis=1), sent.sum(axis=0)

    def spread(v: np.ndarray) -> float:
        return float(v.std() / v.mean()) if v.mean() else 0.0

    return _Exchange(sent=sent, dispatch=spread(ins) > spread(outs))


@dataclass
class ExpertLayout:
    """The trace's uneven all_to_alls at ``ep`` ranks a group (module docstring)."""

    trace: Trace
    trace_ep: int
    ep: int
    imbalance: float | None  # --moe-imbalance; None: the trace's measured one
    seed: int
    _exchanges: dict[tuple[tuple[int, ...], int, int], _Exchange] = field(default_factory=dict)
    _matrices: dict[tuple[tuple[int, ...], int, int, int], np.ndarray] = field(default_factory=dict)
    _tilings: dict[tuple[int, int], tuple[np.ndarray, int]] = field(default_factory=dict)
    _gaps: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # per (rank, iteration)

    def __post_init__(self) -> None:
        if self.imbalance is not None and not 1 <= self.imbalance <= self.ep:
            raise ConfigError(f"--moe-imbalance {self.imbalance:g}: give the largest split over the mean, from 1 "
                              f"(balanced) to the expert-parallel group's size {self.ep}")

    @property
    def experts_per_rank(self) -> int | None:
        """None where the trace records no experts (its ep keeps its size: only replicas grew)."""
        experts = self.trace.meta.experts
        return None if experts is None else experts.count // self.ep

    def exchange(self, group: tuple[int, ...], k: int, a: int) -> _Exchange:
        """The a-th uneven all_to_all of trace iteration k on the trace's group ``group``."""
        key = (group, k, a)
        got = self._exchanges.get(key)
        if got is None:
            by_rank = {p.rank: p for p in self.trace.ranks}
            rows = [[op for op in by_rank[r].iterations[k].colls if op.splits is not None][a].splits for r in group]
            got = self._exchanges[key] = _exchange(rows)
        return got

    def tiling(self, k: int, anchor: int) -> tuple[np.ndarray, int]:
        """Iteration k's draw for the replay's group whose lowest worker is ``anchor``: the trace
        position each of its positions stands for, and the position --moe-imbalance makes hot
        (drawn either way, so the tiling is the same with or without it)."""
        got = self._tilings.get((k, anchor))
        if got is None:
            rng = np.random.default_rng([self.seed, k, anchor])
            c = rng.permutation(np.repeat(np.arange(self.trace_ep), self.ep // self.trace_ep))
            got = self._tilings[(k, anchor)] = (c, int(rng.integers(self.ep)))
        return got

    def matrix(self, group: tuple[int, ...], k: int, a: int, anchor: int) -> np.ndarray:
        """What each position of the replay's group whose lowest worker is ``anchor`` sends each other
        in its a-th uneven all_to_all of iteration k (ep x ep elements)."""
        key = (group, k, a, anchor)
        got = self._matrices.get(key)
        if got is None:
            c, hot = self.tiling(k, anchor)
            ex = self.exchange(group, k, a)
            if self.imbalance is None:
                got = np.rint(ex.sent[np.ix_(c, c)] * (self.trace_ep / self.ep))
            else:
                loads = np.full(self.ep, (self.ep - self.imbalance) / (self.ep - 1) if self.ep > 1 else 1.0)
                loads[hot] = self.imbalance
                if ex.dispatch:
                    got = np.rint(np.outer(ex.sent.sum(axis=1)[c], loads) / self.ep)
                else:
                    got = np.rint(np.outer(loads, ex.sent.sum(axis=0)[c]) / self.ep)
            got = self._matrices[key] = got.astype(np.int64)
        return got

    def resplit(self, scaled: Coll, original: Coll, rank: int, w: int, k: int, a: int) -> Coll:
        """Worker ``w``'s copy of trace rank ``rank``'s a-th uneven all_to_all of iteration k, with its
        per-peer sizes at the replay's group (``scaled.group``, ascending)."""
        members = scaled.group if scaled.group is not None else tuple(range(scaled.group_size))
        if len(members) != self.ep:
            raise ConfigError(f"all_to_all {original.id} of rank {rank} runs on {len(members)} workers at this "
                              f"layout; emu resizes uneven all_to_alls on the expert-parallel dimension only")
        group = original.group if original.group is not None else tuple(range(self.trace.meta.world_size))
        m = self.matrix(tuple(group), k, a, members[0])
        j = members.index(w)
        send, recv = tuple(int(x) for x in m[j]), tuple(int(x) for x in m[:, j])
        count = sum(send)
        return replace(scaled, splits=Splits(send, recv), count=count, bytes=count * scaled.dtype.itemsize)

    def follow_tokens(self, trace_ops: tuple[Op, ...], ops: tuple[Op, ...], k: int) -> tuple[Op, ...]:
        """``ops``, a worker's copy of a trace rank's iteration k (``trace_ops``), with the compute
        after each dispatch made the group's measured compute per element received times what the
        worker received (its own compute there scaled to that total)."""
        out, factor, a = [], 1.0, 0
        for old, new in zip(trace_ops, ops, strict=True):
            if isinstance(old, Coll):
                factor = 1.0
                if old.splits is not None and isinstance(new, Coll) and new.splits is not None:
                    rate, own = self.per_element(old, k, a), _gaps(trace_ops)[a]
                    if rate is not None and own:  # a worker that received nothing computes nothing
                        factor = rate * sum(new.splits.recv_elements) / own
                    a += 1
            elif isinstance(new, Compute) and factor != 1.0:
                new = replace(new, dur_us=new.dur_us * factor)
            out.append(new)
        return tuple(out)

    def per_element(self, op: Coll, k: int, a: int) -> float | None:
        """After the a-th uneven all_to_all of trace iteration k, a dispatch: the compute of every
        rank of its group there over the elements they received in it (us); None after a combine."""
        group = tuple(op.group if op.group is not None else range(self.trace.meta.world_size))
        ex = self.exchange(group, k, a)
        received = int(ex.sent.sum())
        if not ex.dispatch or not received:
            return None
        return sum(self.gaps(r, k)[a] for r in group) / received

    def gaps(self, rank: int, k: int) -> list[float]:
        """Trace rank ``rank``'s compute after each uneven all_to_all of iteration k, up to the next
        collective."""
        got = self._gaps.get((rank, k))
        if got is None:
            prog = next(p for p in self.trace.ranks if p.rank == rank)
            got = self._gaps[(rank, k)] = _gaps(prog.iterations[k].ops)
        return got


def _gaps(ops: tuple[Op, ...]) -> list[float]:
    out: list[float] = []
    inside = False
    for op in ops:
        if isinstance(op, Coll):
            inside = op.splits is not None
            if inside:
                out.append(0.0)
        elif isinstance(op, Compute) and inside:
            out[-1] += op.dur_us
    return out


def with_expert_gradients(trace: Trace, ep: int) -> Trace:
    """Every iteration of every rank with its expert gradients' all_reduce over the data-parallel
    dimension the replay adds (module docstring): on the group of the rank alone in the trace, of
    role dp, so the layout spans that dimension with it."""
    experts = trace.meta.experts
    assert experts is not None
    count = experts.count // ep * experts.params_per_expert
    dtype = next((d for d in Dtype if d.value == trace.meta.dtype), Dtype.FLOAT32)  # the gradients' dtype
    ranks = []
    for prog in trace.ranks:
        iterations = []
        for it in prog.iterations:
            ident = max((op.id for op in it.colls), default=-1) + 1
            op = Coll(id=ident, kind=CollKind.ALL_REDUCE, dtype=dtype, count=count, bytes=count * dtype.itemsize,
                      group_size=1, group=(prog.rank,), group_role=GroupRole.DP)
            iterations.append(replace(it, ops=_after_last_all_reduce(it.ops, op)))
        ranks.append(RankProgram(rank=prog.rank, iterations=tuple(iterations)))
    return replace(trace, ranks=tuple(ranks))


def _after_last_all_reduce(ops: tuple[Op, ...], added: Coll) -> tuple[Op, ...]:
    """``added`` issued right after the iteration's last all_reduce and waited with it (at the end,
    waited at once, where there is none)."""
    last = max((i for i, op in enumerate(ops) if isinstance(op, Coll) and op.kind == CollKind.ALL_REDUCE),
                default=None)
    if last is None:
        return (*ops, added, Wait(ids=(added.id,)))
    reduced = ops[last].id  # type: ignore[union-attr]
    out = list(ops[:last + 1]) + [added]
    for op in ops[last + 1:]:
        if isinstance(op, Wait) and reduced in op.ids:
            op = replace(op, ids=(*op.ids, added.id))
        out.append(op)
    return tuple(out)
