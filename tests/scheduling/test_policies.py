"""Scheduling policies on hand-checked cases (issue 17, item 3): orders whose optimum is
known, precedence between a cojob's stages, the mapping of an order onto k classes."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agg_optimizer.scheduling.policies import POLICIES, Demand, bssi, schedule, to_classes


def one_link(sizes: dict[str, float], **kw) -> list[Demand]:
    return [Demand(job=j, links={"L": b}, **kw) for j, b in sizes.items()]


def total_weighted_completion(order, size, weight) -> float:
    t, total = 0.0, 0.0
    for u in order:
        t += size[u]
        total += weight[u] * t
    return total


def test_small_first_on_one_link_is_what_varys_and_sincronia_give() -> None:
    # sizes 1 and 2 on one link: small first gives completions 1 and 3 (mean 2), the other
    # order 2 and 3 (mean 2.5)
    ds = one_link({"big": 2.0, "small": 1.0})
    for policy in ("varys", "sincronia"):
        assert schedule(policy, ds, k=2).order == ["small", "big"], policy


def test_sincronia_follows_the_weights() -> None:
    # weight 10 on the big job: big first costs 10*2 + 1*3 = 23, small first 1 + 10*3 = 31
    ds = [Demand("big", {"L": 2.0}, weight=10.0), Demand("small", {"L": 1.0}, weight=1.0)]
    assert schedule("sincronia", ds, k=2).order == ["big", "small"]
    assert schedule("varys", ds, k=2).order == ["small", "big"]  # Varys ignores weights


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.1, 10.0)), min_size=1, max_size=6))
def test_bssi_is_optimal_on_one_link(jobs) -> None:
    """On one link BSSI is Smith's rule, which minimises the weighted completion time:
    checked against every order."""
    names = [f"j{i}" for i in range(len(jobs))]
    size = {n: s for n, (s, _) in zip(names, jobs, strict=True)}
    weight = {n: w for n, (_, w) in zip(names, jobs, strict=True)}
    got = bssi(names, {n: {"L": size[n]} for n in names}, weight)
    best = min(total_weighted_completion(p, size, weight) for p in itertools.permutations(names))
    assert total_weighted_completion(got, size, weight) == pytest.approx(best, rel=1e-9)


def test_bssi_takes_the_bottleneck_link() -> None:
    # A is small on the busy link X, B large on X; C is alone on an idle link Y. X decides:
    # B goes last; A before it.
    load = {"A": {"X": 1.0}, "B": {"X": 5.0}, "C": {"Y": 0.5}}
    order = bssi(["A", "B", "C"], load, {"A": 1.0, "B": 1.0, "C": 1.0})
    assert order.index("A") < order.index("B")


def test_fifo_and_baraat_demote_only_heavy_jobs() -> None:
    ds = [
        Demand("first", {"L": 5e9}, arrival_s=0.0, sent_bytes=3e9),
        Demand("second", {"L": 1e6}, arrival_s=1.0),
        Demand("third", {"L": 1e6}, arrival_s=2.0, sent_bytes=10.0),
    ]
    assert schedule("fifo", ds, k=3).order == ["first", "second", "third"]
    assert schedule("baraat", ds, k=3, heavy_bytes=1e9).order == ["second", "third", "first"]


def test_jpas_serves_the_least_progressed_first() -> None:
    ds = [
        Demand("late", {"L": 1.0}, progress=0.9, arrival_s=0.0),
        Demand("early", {"L": 1.0}, progress=0.1, arrival_s=5.0),
        Demand("mid", {"L": 1.0}, progress=0.5, arrival_s=1.0),
        Demand("early-too", {"L": 1.0}, progress=0.1, arrival_s=6.0),
    ]
    s = schedule("jpas", ds, k=2)
    assert s.order == ["early", "early-too", "mid", "late"]
    assert s.classes == {"early": 1, "early-too": 1, "mid": 0, "late": 0}


def test_grouper_keeps_a_cojobs_trials_together_and_its_stages_in_order() -> None:
    """Cojob A: two trials, small rounds, 1 round left of stage 0, then a long stage 1.
    Cojob B: one trial, a medium round. Grouper puts A's current stage first (small), and
    A's trials share its position (a stage ends with its slowest trial); A's later stage
    never comes before its current one."""
    ds = [
        Demand("a1", {"L": 1.0}, cojob="A", stage=0),
        Demand("a2", {"L": 1.0}, cojob="A", stage=0),
        Demand("b1", {"L": 3.0}, cojob="B", stage=0),
    ]
    s = schedule("grouper", ds, k=2, stage_rounds={("A", 1): 10})
    assert s.order[:2] == ["a1", "a2"] and s.order[2] == "b1"
    assert s.classes["a1"] == s.classes["a2"] == 1 and s.classes["b1"] == 0
    # per-job Sincronia splits the cojob's trials when another job sits between them
    ds2 = [*ds[:1], Demand("c", {"L": 1.5}), ds[1]]
    ds2[2] = Demand("a2", {"L": 2.0}, cojob="A", stage=0)
    per_job = schedule("sincronia", ds2, k=3).order
    assert per_job == ["a1", "c", "a2"]
    grouped = schedule("grouper", ds2, k=3).order
    assert abs(grouped.index("a1") - grouped.index("a2")) == 1


def test_grouper_never_puts_a_later_stage_before_an_earlier_one() -> None:
    # without precedence, A's huge current stage would go last behind its own small later
    # stage; with it, A's stages stay a chain (the later unit only ranks the cojob)
    from agg_optimizer.scheduling.policies import _grouper

    ds = [Demand("a1", {"L": 100.0}, cojob="A"), Demand("b1", {"L": 1.0}, cojob="B")]
    order = _grouper(ds, stage_rounds={("A", 1): 1, ("B", 1): 1})
    assert order == ["b1", "a1"]


@pytest.mark.parametrize("n,k", [(1, 4), (3, 4), (4, 4), (8, 4), (9, 4), (5, 1), (0, 3)])
def test_classes_keep_the_order_and_use_every_class(n: int, k: int) -> None:
    order = [f"j{i}" for i in range(n)]
    cls = to_classes(order, k)
    values = [cls[j] for j in order]
    assert values == sorted(values, reverse=True)  # never below a later job
    assert all(0 <= v < k for v in values)
    if n:
        assert values[0] == k - 1  # the first job is served first
    if n >= k:
        assert set(values) == set(range(k))
    sizes = [values.count(c) for c in set(values)]
    assert not sizes or max(sizes) - min(sizes) <= 1  # equal groups


def test_fair_puts_everyone_in_one_class_and_bad_input_names_the_field() -> None:
    ds = one_link({"a": 1.0, "b": 2.0})
    assert set(schedule("fair", ds, k=4).classes.values()) == {3}
    with pytest.raises(ValueError, match="policy: unknown"):
        schedule("magic", ds, k=2)
    with pytest.raises(ValueError, match=r"demands\[1\].job: duplicate"):
        schedule("fifo", [ds[0], ds[0]], k=2)
    with pytest.raises(ValueError, match=r"demands\[0\].progress"):
        schedule("jpas", [Demand("x", {"L": 1.0}, progress=1.5)], k=2)
    with pytest.raises(ValueError, match="k: must be >= 1"):
        schedule("fifo", ds, k=0)
    assert set(POLICIES) == {"fair", "fifo", "varys", "sincronia", "baraat", "grouper", "jpas"}


def test_demands_come_from_the_placement_trees() -> None:
    """A k=4 fat-tree job summed at one switch: the links below it carry one stream per
    worker, the links above it one stream; PS-only: the PS's downlink carries them all."""
    from agg_optimizer.model.documents import Instance, Job
    from agg_optimizer.model.topology import fat_tree
    from agg_optimizer.placement.engine import solve
    from agg_optimizer.scheduling.policies import demands_from

    topo = fat_tree(4)
    hosts = [n.id for n in topo.nodes if n.kind == "host"]
    job = Job(id="j", workers=hosts[0:4], ps=hosts[15], update_bytes=1_000_000)
    inst = Instance(topology=topo, jobs=[job])
    ps_switch = next(ln.dst for ln in topo.links if ln.src == job.ps)
    down = f"{ps_switch}->{job.ps}"
    (alone,) = demands_from(inst, solve(inst, "ps"))
    assert alone.links[down] == 4 * 1_000_000
    for w in job.workers:  # every worker's uplink carries its own stream
        up = next(k for k in alone.links if k.startswith(f"{w}->"))
        assert alone.links[up] == 1_000_000
    p = solve(inst, "agg")
    assert p.jobs[0].aggregators
    (summed,) = demands_from(inst, p, {"j": {"progress": 0.5, "cojob": "c"}})
    assert summed.links[down] == 1_000_000 and summed.progress == 0.5 and summed.cojob == "c"
    assert sum(summed.links.values()) < sum(alone.links.values())


def test_grouper_keeps_each_cojob_in_one_class() -> None:
    # 3 cojobs of 3 trials on k=2 classes: cut over jobs, the middle cojob was split (5 jobs
    # up, 4 down); cut over cojobs, every cojob's trials share the class of its position.
    ds = [
        Demand(f"{c}{i}", {"L": size, f"h{c}{i}": size}, cojob=c)
        for c, size in (("A", 1.0), ("B", 2.0), ("C", 3.0))
        for i in range(3)
    ]
    s = schedule("grouper", ds, k=2)
    by_cojob: dict[str, set[int]] = {}
    for d in ds:
        by_cojob.setdefault(d.cojob or "", set()).add(s.classes[d.job])
    assert all(len(v) == 1 for v in by_cojob.values()), by_cojob
    assert by_cojob["A"] == {1} and by_cojob["C"] == {0}  # the smallest stage first
    assert len({c for v in by_cojob.values() for c in v}) == 2  # both classes used
    # Per job the same order would have split one cojob across the two classes.
    per_job = to_classes(s.order, 2)
    assert any(len({per_job[f"{c}{i}"] for i in range(3)}) > 1 for c in "ABC")
