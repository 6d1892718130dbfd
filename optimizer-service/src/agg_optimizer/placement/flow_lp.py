"""The AGG placement model as a min-cost circulation, solved as an LP by HiGHS.

Decision x_gs in {0,1}: group g (a set of streams of one job) is summed at switch s.

    nodes: source, sink, J_j (job), G_g (group), S_s (switch)
    arcs                        capacity                    cost
    source -> J_j   segments    widths summing to K_j       nondecreasing per unit
    J_j -> G_g                  1                           0
    G_g -> S_s  (= x_gs)        1                           c_gs
    S_s -> sink     segments    widths summing to M_s       nondecreasing per unit
    sink -> source              sum_j K_j                   0
    every node: inflow - outflow = 0

Each column of the equality matrix has one +1 (head) and one -1 (tail): a node-arc incidence
matrix, totally unimodular. Bounds are integers and the convex costs are encoded by segments
with integer breakpoints, so every vertex of the LP is integral and HiGHS's simplex returns
one. M_s = slots_s // pool is the number of job pools switch s holds; it is an integer row
only when every job that may use s asks for the same pool size.

What this builder refuses (and `solve` routes to the MILP path when allowed):
  * "knapsack": two jobs with different pool sizes may use one switch, so the slot row
    has coefficients other than 1 and the matrix is no longer an incidence matrix.
  * "facility": one switch is a candidate of two groups of the same job; "job j uses s" then
    needs x <= y linking rows, whose odd cycles break TU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import highspy
import numpy as np

INTEGRALITY_TOL = 1e-7
# From this many columns the dual simplex prices with Devex instead of HiGHS's default (dual
# steepest edge): on the k=64 fat-tree with 10,000 jobs (69,981 columns) AGG's first, cold
# solve took 0.65 s instead of 2.2 s, its warm re-solves the same (docs/benchmarks/scale.md).
# Both are exact, but where the LP has several optimal vertices they may return different
# ones, and AGG's descent then ends elsewhere: k=64 with 10,000 jobs came out 4e-6 lower,
# and so did a k=32 fat-tree with 1,000 jobs (tests/optimizer/test_placement_digest.py),
# whose cold solve Devex does not speed up. Smaller LPs keep the default and their
# placements stay what they were.
DEVEX_MIN_COLUMNS = 60_000
# From this many columns the cold solve starts from a spanning tree of the zero circulation
# (`tree_basis`) instead of HiGHS's all-slack basis, and prices that solve by dual steepest
# edge; the warm re-solves keep Devex. On the k=64 fat-tree with 10,000 jobs the cold solve
# took 0.18-0.25 s and 6,626 iterations instead of 0.6-0.8 s and 15,880 (Devex from the
# slack basis; dual steepest edge from it took 2.4 s); k=32 and k=48 with 10,000 jobs 0.08
# and 0.15 s instead of 0.22 and 0.36 s. The optimal value is the same, but not always the
# vertex or its basis, so AGG's descent on those three ends elsewhere (within 6.2e-5 of the
# objective; recorded again in tests/fixtures/placement_digest.json), while every smaller
# LP keeps the slack start and its placement (docs/benchmarks/scale.md, round 7).
TREE_START_MIN_COLUMNS = DEVEX_MIN_COLUMNS


class NotTotallyUnimodular(ValueError):
    """The problem has a structure the LP path cannot solve exactly."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class SolveError(RuntimeError):
    pass


@dataclass
class FlowProblem:
    """Pure data. Switch and job indices are dense; arcs carry the x_gs costs."""

    job_cap: np.ndarray  # K_j
    job_pool: np.ndarray  # slots per pool of job j
    group_job: np.ndarray  # job of each group
    arc_group: np.ndarray
    arc_switch: np.ndarray
    arc_cost: np.ndarray
    switch_slots: np.ndarray
    switch_unit_cost: np.ndarray  # load cost per pool; the i-th quarter costs (i+1) times it
    job_unit_cost: np.ndarray | None = None  # cost per aggregator used, constant per job
    # Names for messages (a switch's and a job's id); indices where absent.
    switch_names: list[str] | None = None
    job_names: list[str] | None = None

    def switch_name(self, s: int) -> str:
        return self.switch_names[s] if self.switch_names else str(s)

    def job_name(self, j: int) -> str:
        return self.job_names[j] if self.job_names else str(j)

    @property
    def n_jobs(self) -> int:
        return len(self.job_cap)

    @property
    def n_groups(self) -> int:
        return len(self.group_job)

    @property
    def n_switches(self) -> int:
        return len(self.switch_slots)


@dataclass
class FlowSolution:
    chosen: np.ndarray  # bool per arc
    objective: float
    path: str
    reason: str | None
    build_s: float
    solve_s: float
    max_integrality_gap: float
    columns: int
    rows: int
    extra: dict = field(default_factory=dict)


def check_structure(p: FlowProblem) -> None:
    """Raise NotTotallyUnimodular for the knapsack and facility structures."""
    arc_job = p.group_job[p.arc_group]
    if len(arc_job):
        # facility: (job, switch) pairs reached from two different groups
        js = arc_job * p.n_switches + p.arc_switch
        order = np.lexsort((p.arc_group, js))
        js_s, g_s = js[order], p.arc_group[order]
        same = (js_s[1:] == js_s[:-1]) & (g_s[1:] != g_s[:-1])
        if same.any():
            k = int(np.argmax(same))
            j, s = divmod(int(js_s[k]), p.n_switches)
            raise NotTotallyUnimodular(
                "facility",
                f"switch {p.switch_name(s)} is a candidate of two groups of job {p.job_name(j)}",
            )
        # knapsack: different pool sizes at one switch
        pools = p.job_pool[arc_job]
        lo = np.full(p.n_switches, np.iinfo(np.int64).max)
        hi = np.zeros(p.n_switches, dtype=np.int64)
        np.minimum.at(lo, p.arc_switch, pools)
        np.maximum.at(hi, p.arc_switch, pools)
        bad = np.nonzero((hi > 0) & (lo != hi))[0]
        if len(bad):
            s = int(bad[0])
            raise NotTotallyUnimodular(
                "knapsack",
                f"jobs with pool sizes {lo[s]} and {hi[s]} share switch {p.switch_name(s)}",
            )


def _segments(total: int, unit: float, parts: int = 4) -> list[tuple[int, float]]:
    """Split capacity `total` into up to `parts` integer widths with costs unit*1, unit*2..."""
    if total <= 0:
        return []
    base, rem = divmod(total, parts)
    widths = [base + (1 if i < rem else 0) for i in range(parts)]
    return [(w, unit * (i + 1)) for i, w in enumerate(widths) if w > 0]


def switch_pools(p: FlowProblem) -> np.ndarray:
    """M_s: pools each switch holds, with the (single) pool size used there."""
    pool_at = np.ones(p.n_switches, dtype=np.int64)
    if len(p.arc_switch):
        pool_at[p.arc_switch] = p.job_pool[p.group_job[p.arc_group]]
    return p.switch_slots // pool_at


@dataclass
class FlowNetwork:
    """The circulation as arrays: arc tails, heads, upper bounds, costs."""

    n_nodes: int
    tail: np.ndarray
    head: np.ndarray
    upper: np.ndarray
    cost: np.ndarray
    x_cols: np.ndarray  # column index of each problem arc, -1 if pruned
    seg_kind: list[str]


def build_network(p: FlowProblem, *, prune: bool = True) -> FlowNetwork:
    """Pure function from problem to circulation. Arcs with cost >= 0 are pruned when
    `prune`: with nonnegative segment costs an optimum never needs them."""
    keep = p.arc_cost < 0 if prune else np.ones(len(p.arc_cost), dtype=bool)
    src, sink = 0, 1
    job0 = 2
    grp0 = job0 + p.n_jobs
    sw0 = grp0 + p.n_groups
    tails: list[np.ndarray] = []
    heads: list[np.ndarray] = []
    ups: list[np.ndarray] = []
    costs: list[np.ndarray] = []
    kinds: list[str] = []

    def add(t, h, u, c, kind: str) -> None:
        t, h = np.asarray(t, dtype=np.int64), np.asarray(h, dtype=np.int64)
        tails.append(t)
        heads.append(h)
        ups.append(np.broadcast_to(np.asarray(u, dtype=np.float64), t.shape).copy())
        costs.append(np.broadcast_to(np.asarray(c, dtype=np.float64), t.shape).copy())
        kinds.extend([kind] * len(t))

    used_groups, per_group = np.unique(p.arc_group[keep], return_counts=True)
    used_jobs = np.unique(p.group_job[used_groups])
    used_sw = np.unique(p.arc_switch[keep])
    jc = p.job_unit_cost if p.job_unit_cost is not None else np.zeros(p.n_jobs)
    add(np.full(len(used_jobs), src), job0 + used_jobs, p.job_cap[used_jobs], jc[used_jobs], "job")
    # A group with one candidate is the series J_j -> G_g -> S_s: one arc J_j -> S_s.
    multi = used_groups[per_group > 1]
    add(job0 + p.group_job[multi], grp0 + multi, 1.0, 0.0, "group")
    x_first = sum(len(t) for t in tails)
    single = np.zeros(p.n_groups, dtype=bool)
    single[used_groups[per_group == 1]] = True
    g_k = p.arc_group[keep]
    x_tail = np.where(single[g_k], job0 + p.group_job[g_k], grp0 + g_k)
    add(x_tail, sw0 + p.arc_switch[keep], 1.0, p.arc_cost[keep], "x")
    pools = switch_pools(p)
    st, sh, su, sc = [], [], [], []
    for s in used_sw:
        for w, c in _segments(int(pools[s]), float(p.switch_unit_cost[s])):
            st.append(sw0 + s)
            sh.append(sink)
            su.append(w)
            sc.append(c)
    add(st, sh, su, sc, "switch")
    add([sink], [src], float(p.job_cap[used_jobs].sum()), 0.0, "return")
    x_cols = np.full(len(p.arc_cost), -1, dtype=np.int64)
    x_cols[np.nonzero(keep)[0]] = x_first + np.arange(int(keep.sum()))
    # rows only for nodes that some arc touches
    tail, head = np.concatenate(tails), np.concatenate(heads)
    used, inv = np.unique(np.concatenate([tail, head]), return_inverse=True)
    return FlowNetwork(
        n_nodes=len(used),
        tail=inv[: len(tail)],
        head=inv[len(tail) :],
        upper=np.concatenate(ups),
        cost=np.concatenate(costs),
        x_cols=x_cols,
        seg_kind=kinds,
    )


def incidence_csc(net: FlowNetwork) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Node-arc incidence in CSC form: column a has -1 at its tail row and +1 at its head."""
    m = len(net.tail)
    lo = np.minimum(net.tail, net.head)
    hi = np.maximum(net.tail, net.head)
    index = np.empty(2 * m, dtype=np.int32)
    index[0::2], index[1::2] = lo, hi
    value = np.empty(2 * m)
    value[0::2] = np.where(net.tail < net.head, -1.0, 1.0)
    value[1::2] = -value[0::2]
    start = np.arange(0, 2 * m + 1, 2, dtype=np.int32)
    return start, index, value


def tree_basis(net: FlowNetwork) -> highspy.HighsBasis | None:
    """A basis of the zero circulation: the arcs source -> job, job -> group, each switch's
    first (cheapest) segment to the sink and sink -> source are basic, every other arc sits
    at zero, and the first row's slack is basic (the rows sum to zero, so one is redundant).
    Those arcs join every node to the source or the sink and the two by the return arc: a
    spanning tree, so the basis is nonsingular, and all flows are zero, so it is feasible.
    None where the network is not of that shape (a switch without a segment)."""
    kinds = np.asarray(net.seg_kind)
    basic = (kinds == "job") | (kinds == "group") | (kinds == "return")
    seg = np.nonzero(kinds == "switch")[0]  # each switch's segments side by side, cheapest first
    if len(seg):
        first = np.ones(len(seg), dtype=bool)
        first[1:] = net.tail[seg[1:]] != net.tail[seg[:-1]]
        basic[seg[first]] = True
    if int(basic.sum()) != net.n_nodes - 1:
        return None
    b = highspy.HighsBasis()
    lower, basic_status = highspy.HighsBasisStatus.kLower, highspy.HighsBasisStatus.kBasic
    b.col_status = [basic_status if x else lower for x in basic.tolist()]
    b.row_status = [basic_status] + [lower] * (net.n_nodes - 1)
    b.valid = True
    return b


def check_incidence(net: FlowNetwork, start, index, value) -> None:
    """The structural TU certificate, run on every build: each column holds exactly one +1
    and one -1 in distinct rows, bounds are integers, segment costs are nondecreasing."""
    if not (np.all(np.diff(start) == 2)):
        raise NotTotallyUnimodular("structure", "a column without exactly two entries")
    pairs = value.reshape(-1, 2)
    if not np.all(pairs.sum(axis=1) == 0) or not np.all(np.abs(pairs) == 1):
        raise NotTotallyUnimodular("structure", "a column that is not one +1 and one -1")
    if np.any(index[0::2] == index[1::2]):
        raise NotTotallyUnimodular("structure", "a self-loop column")
    if not np.all(net.upper == np.round(net.upper)):
        raise NotTotallyUnimodular("structure", "a non-integer bound")
    kinds = np.array(net.seg_kind)
    for kind in ("switch", "job"):
        sel = kinds == kind
        # each node's segments in their order, nodes side by side (one sort, not a pass
        # over every segment per node: 0.2 s at k=64 with 10,000 jobs)
        by_node = np.argsort(net.tail[sel], kind="stable")
        t, c = net.tail[sel][by_node], net.cost[sel][by_node]
        if np.any((t[1:] == t[:-1]) & (np.diff(c) < 0)):
            raise NotTotallyUnimodular("convexity", f"{kind} segment costs decrease")


def _cost_scale(cost: np.ndarray) -> float:
    """A power of two bringing the largest |cost| near 1 when it is beyond 1e6 or under
    1e-6; 1.0 otherwise (the placements of ordinary instances stay as recorded)."""
    top = float(np.max(np.abs(cost))) if len(cost) else 0.0
    if top == 0.0 or not np.isfinite(top) or 1e-6 <= top <= 1e6:
        return 1.0
    return float(2.0 ** np.round(np.log2(top)))


class FlowLP:
    """The exact LP path: checks the structure, builds the circulation once, solves it.

    `run(arc_cost)` re-solves with new x-arc costs on the same structure, warm-started from
    the previous basis (AGG's iterations change costs only). Raises NotTotallyUnimodular for
    the refused structures.
    """

    def __init__(
        self,
        p: FlowProblem,
        *,
        prune: bool = True,
        solver: str = "simplex",
        crossover: bool = True,
    ) -> None:
        t0 = time.perf_counter()
        check_structure(p)
        self.problem = p
        self.net = net = build_network(p, prune=prune)
        self.pruned = prune
        start, index, value = incidence_csc(net)
        check_incidence(net, start, index, value)
        lp = highspy.HighsLp()
        lp.num_col_ = len(net.tail)
        lp.num_row_ = net.n_nodes
        # Costs far from 1 (1e15-byte updates on 1e-6 Gb/s links at weight 1e6 reach 1e19 s,
        # where HiGHS's infinity is 1e20) are scaled by a power of two: exact, so the LP
        # and its optimum are the same; the objective is scaled back.
        self.cost_scale = _cost_scale(net.cost)
        lp.col_cost_ = net.cost / self.cost_scale
        lp.col_lower_ = np.zeros(lp.num_col_)
        lp.col_upper_ = net.upper
        lp.row_lower_ = np.zeros(net.n_nodes)
        lp.row_upper_ = np.zeros(net.n_nodes)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = index
        lp.a_matrix_.value_ = value
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("solver", solver)
        h.setOptionValue("run_crossover", "on" if crossover else "off")
        # Presolve costs more than it saves on these flow LPs (measured: docs/benchmarks.md).
        h.setOptionValue("presolve", "off")
        h.setOptionValue("threads", 1)
        if lp.num_col_ >= DEVEX_MIN_COLUMNS:
            h.setOptionValue("simplex_dual_edge_weight_strategy", 1)  # Devex
        h.passModel(lp)
        self.tree_start = False
        if lp.num_col_ >= TREE_START_MIN_COLUMNS and solver == "simplex":
            basis = tree_basis(net)
            if basis is not None and h.setBasis(basis) == highspy.HighsStatus.kOk:
                h.setOptionValue("simplex_dual_edge_weight_strategy", 2)  # dual steepest edge
                self.tree_start = True
        self.highs = h
        self.columns, self.rows = lp.num_col_, lp.num_row_
        self._pending_build = time.perf_counter() - t0

    def run(self, arc_cost: np.ndarray | None = None) -> FlowSolution:
        t0 = time.perf_counter()
        net, h = self.net, self.highs
        kept = net.x_cols >= 0
        if arc_cost is not None:
            if self.pruned:
                raise ValueError("arc_cost: re-costing needs a model built with prune=False")
            cols = net.x_cols[kept].astype(np.int32)
            cost = np.asarray(arc_cost, dtype=float)[kept] / self.cost_scale
            h.changeColsCost(len(cols), cols, cost)
        build = self._pending_build + time.perf_counter() - t0
        self._pending_build = 0.0
        t1 = time.perf_counter()
        h.run()
        status = h.getModelStatus()
        started = arc_cost is not None or self.tree_start
        if self.tree_start:  # the warm re-solves price by Devex again
            self.tree_start = False
            h.setOptionValue("simplex_dual_edge_weight_strategy", 1)
        if status != highspy.HighsModelStatus.kOptimal and started:
            # A warm re-solve from the last basis can end `Unknown` where a cold solve of
            # the same LP is optimal (agg-mm's bisection on a k=4 fat-tree, 3 jobs, cap 1).
            h.clearSolver()
            h.run()
            status = h.getModelStatus()
        t2 = time.perf_counter()
        if status != highspy.HighsModelStatus.kOptimal:
            raise SolveError(f"HiGHS returned {h.modelStatusToString(status)}")
        col = np.asarray(h.getSolution().col_value)
        gap = float(np.max(np.abs(col - np.round(col)))) if len(col) else 0.0
        if gap > INTEGRALITY_TOL:
            raise SolveError(f"LP solution is fractional (distance {gap:.3g} from an integer)")
        chosen = np.zeros(len(self.problem.arc_cost), dtype=bool)
        chosen[kept] = np.round(col[net.x_cols[kept]]) == 1
        return FlowSolution(
            chosen=chosen,
            objective=float(h.getInfo().objective_function_value) * self.cost_scale,
            path="lp",
            reason=None,
            build_s=build,
            solve_s=t2 - t1,
            max_integrality_gap=gap,
            columns=self.columns,
            rows=self.rows,
            extra={"col_value": col, "network": net},
        )


def solve_lp(p: FlowProblem, *, solver: str = "simplex", crossover: bool = True) -> FlowSolution:
    """One exact LP solve. Raises NotTotallyUnimodular for the refused structures."""
    return FlowLP(p, solver=solver, crossover=crossover).run()


def solve_milp(
    p: FlowProblem, *, reason: str | None = None, time_limit: float = 60.0
) -> FlowSolution:
    """General MILP of the same placement model, with facility variables y_js and knapsack
    slot rows. Exact for every structure, including the ones the LP refuses; for TU problems
    it is an independent oracle of the LP.

        min  sum c_gs x_gs + sum_j h_j sum_s y_js + sum_s f_s(sum_j y_js)
        s.t. sum_s x_gs <= 1 (each group),  x_gs <= y_js,  sum_s y_js <= K_j,
             sum_j pool_j y_js <= slots_s,  x, y binary
    """
    t0 = time.perf_counter()
    arc_job = p.group_job[p.arc_group]
    keep = p.arc_cost < 0
    ak = np.nonzero(keep)[0]
    pairs = sorted({(int(arc_job[a]), int(p.arc_switch[a])) for a in ak})
    y_of = {js: i for i, js in enumerate(pairs)}
    nx_ = len(ak)
    ny = len(pairs)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", time_limit)
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_rel_gap", 0.0)
    inf = highspy.kHighsInf
    jc = p.job_unit_cost if p.job_unit_cost is not None else np.zeros(p.n_jobs)
    costs = list(p.arc_cost[ak]) + [float(jc[j]) for j, _ in pairs]
    for _ in costs:
        h.addVar(0.0, 1.0)
    # switch load segments u_sk
    min_pool = np.full(p.n_switches, np.iinfo(np.int64).max)
    if ny:
        np.minimum.at(min_pool, [s for _, s in pairs], [int(p.job_pool[j]) for j, _ in pairs])
    seg_cols: dict[int, list[int]] = {}
    ncol = nx_ + ny
    for s in sorted({s for _, s in pairs}):
        for w, c in _segments(int(p.switch_slots[s] // min_pool[s]), float(p.switch_unit_cost[s])):
            h.addVar(0.0, float(w))
            costs.append(c)
            seg_cols.setdefault(s, []).append(ncol)
            ncol += 1
    h.changeColsCost(ncol, np.arange(ncol, dtype=np.int32), np.array(costs, dtype=float))
    h.changeColsIntegrality(
        ncol, np.arange(ncol, dtype=np.int32), np.full(ncol, highspy.HighsVarType.kInteger)
    )

    def row(lo: float, hi: float, cols: list[int], vals: list[float]) -> None:
        h.addRow(lo, hi, len(cols), np.array(cols, dtype=np.int32), np.array(vals, dtype=float))

    by_group: dict[int, list[int]] = {}
    for i, a in enumerate(ak):
        by_group.setdefault(int(p.arc_group[a]), []).append(i)
        row(-inf, 0.0, [i, nx_ + y_of[(int(arc_job[a]), int(p.arc_switch[a]))]], [1.0, -1.0])
    for cols in by_group.values():
        row(-inf, 1.0, cols, [1.0] * len(cols))
    by_job: dict[int, list[int]] = {}
    by_sw: dict[int, list[int]] = {}
    for (j, s), i in y_of.items():
        by_job.setdefault(j, []).append(nx_ + i)
        by_sw.setdefault(s, []).append(nx_ + i)
    for j, cols in by_job.items():
        row(-inf, float(p.job_cap[j]), cols, [1.0] * len(cols))
    for s, cols in by_sw.items():
        pools = [float(p.job_pool[pairs[c - nx_][0]]) for c in cols]
        row(-inf, float(p.switch_slots[s]), cols, pools)
        segs = seg_cols.get(s, [])
        row(0.0, 0.0, cols + segs, [1.0] * len(cols) + [-1.0] * len(segs))
    t1 = time.perf_counter()
    h.run()
    t2 = time.perf_counter()
    status = h.getModelStatus()
    ok = (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kModelEmpty)
    if status not in ok:
        raise SolveError(f"HiGHS MILP returned {h.modelStatusToString(status)}")
    col = np.asarray(h.getSolution().col_value)
    chosen = np.zeros(len(p.arc_cost), dtype=bool)
    chosen[ak] = np.round(col[:nx_]) == 1
    return FlowSolution(
        chosen=chosen,
        objective=float(h.getInfo().objective_function_value) if ncol else 0.0,
        path="milp",
        reason=reason,
        build_s=t1 - t0,
        solve_s=t2 - t1,
        max_integrality_gap=float(np.max(np.abs(col - np.round(col)))) if len(col) else 0.0,
        columns=ncol,
        rows=h.getNumRow(),
    )


def solve(p: FlowProblem, *, allow_milp: bool = True) -> FlowSolution:
    """LP when the structure is TU; otherwise the MILP path, on purpose and labelled, or an
    error when `allow_milp` is false. Never a rounded LP."""
    try:
        return solve_lp(p)
    except NotTotallyUnimodular as e:
        if not allow_milp:
            raise
        return solve_milp(p, reason=str(e))


def solve_networkx(p: FlowProblem, scale: float = 1e9) -> tuple[float, np.ndarray]:
    """Independent oracle: the same circulation by networkx's network simplex.
    Costs are scaled to integers (network simplex is exact on integers)."""
    import networkx as nx

    net = build_network(p)
    g = nx.DiGraph()
    for a in range(len(net.tail)):
        t, hd = int(net.tail[a]), int(net.head[a])
        # parallel segment arcs get their own midpoint node (DiGraph has no multi-edges)
        mid = ("arc", a)
        w = round(float(net.cost[a]) * scale)
        g.add_edge(t, mid, capacity=int(net.upper[a]), weight=w)
        g.add_edge(mid, hd, capacity=int(net.upper[a]), weight=0)
    for n in g.nodes:
        g.nodes[n]["demand"] = 0
    cost, flow = nx.network_simplex(g)
    chosen = np.zeros(len(p.arc_cost), dtype=bool)
    for i, col in enumerate(net.x_cols):
        if col >= 0:
            chosen[i] = flow[int(net.tail[col])][("arc", int(col))] == 1
    return cost / scale, chosen
