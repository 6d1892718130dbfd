"""Bad input: an error naming the field, and a one-line CLI failure."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agg_optimizer.model.documents import (
    Instance,
    Job,
    Link,
    LinkTelemetry,
    Node,
    SlotPool,
    Topology,
)
from agg_optimizer.model.topology import fat_tree
from agg_optimizer.model.validation import InstanceError, check_instance


def _inst(**job_kw) -> Instance:
    topo = fat_tree(4)
    base = {"id": "j", "workers": ["h0_0_0", "h1_0_0"], "ps": "h2_0_0", "update_bytes": 1000}
    base.update(job_kw)
    return Instance(topology=topo, jobs=[Job(**base)])


@pytest.mark.parametrize(
    ("kw", "field", "text"),
    [
        ({"workers": ["h0_0_0", "nope"]}, "jobs[0].workers[1]", "unknown node"),
        ({"workers": ["e0_0"]}, "jobs[0].workers[0]", "is a switch"),
        ({"ps": "c0"}, "jobs[0].ps", "is a switch"),
        ({"ps": "zz"}, "jobs[0].ps", "unknown node"),
        ({"workers": ["h0_0_0", "h0_0_0"]}, "jobs[0].workers[1]", "twice"),
        ({"workers": ["h2_0_0"]}, "jobs[0].workers[0]", "parameter server"),
        ({"max_aggregators": 999}, "jobs[0].max_aggregators", "exceeds"),
    ],
)
def test_bad_job_names_the_field(kw, field, text):
    with pytest.raises(InstanceError) as e:
        check_instance(_inst(**kw))
    assert e.value.field == field
    assert text in e.value.message


@pytest.mark.parametrize(
    ("kw", "field", "text"),
    [
        ({"workers": ["h0_0_0", "nope"]}, "jobs[3].workers[1]", "unknown node"),
        ({"workers": ["h0_0_1", "e0_0"]}, "jobs[3].workers[1]", "is a switch"),
        ({"ps": "a1_0"}, "jobs[3].ps", "is a switch"),
        ({"ps": "zz"}, "jobs[3].ps", "unknown node"),
        ({"workers": ["h0_0_1", "h3_1_1", "h0_0_1"]}, "jobs[3].workers[2]", "twice"),
        ({"workers": ["h0_0_1", "h2_0_0"]}, "jobs[3].workers[1]", "parameter server"),
        ({"id": "j1"}, "jobs[3].id", "duplicate job id"),
    ],
)
def test_a_bad_job_among_good_ones_is_named(kw, field, text):
    # the jobs are checked as arrays first (validation._jobs_look_valid); the error still
    # names the first bad one, as the loops did
    inst = _inst()
    good = {"workers": ["h0_0_1", "h1_1_0"], "ps": "h3_0_0", "update_bytes": 1000}
    inst.jobs += [Job(id=f"j{i}", **good) for i in (1, 2)]
    bad = {**good, "id": "j3", "ps": "h2_0_0", **kw}
    inst.jobs += [Job(**bad), Job(id="j4", **{**good, "workers": ["nope", "e0_0"]})]
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == field
    assert text in e.value.message


def test_the_checked_ends_are_the_networks_own() -> None:
    """check_instance hands Network.from_instance the link and telemetry ends it read; the
    network compiled with them is the one compiled without."""
    from agg_optimizer.model.examples import example_instance
    from agg_optimizer.model.network import Network

    inst = example_instance(4, 6, 1)
    checked = check_instance(inst)
    assert checked.telemetry_ends is not None and len(checked.ends) == len(inst.topology.links)
    a, b = Network.from_instance(inst), Network.from_instance(inst, checked)
    assert a.index == b.index and a.attach == b.attach
    assert dict(a.resid) == dict(b.resid) and dict(a.delay) == dict(b.delay)
    for x, y in zip(a.edge_data(), b.edge_data(), strict=True):
        assert x.tolist() == y.tolist()


def test_duplicate_job_ids():
    inst = _inst()
    inst.jobs.append(inst.jobs[0].model_copy())
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == "jobs[1].id"


def test_unreachable_parameter_server():
    topo = fat_tree(2)
    topo.nodes += [Node(id="island", kind="switch"), Node(id="hx", kind="host")]
    topo.links.append(Link(src="hx", dst="island"))
    inst = Instance(topology=topo, jobs=[Job(id="j", workers=["h0_0_0"], ps="hx", update_bytes=1)])
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == "jobs[0].ps" and "unreachable" in e.value.message


def test_link_to_unknown_node_and_telemetry_on_a_missing_link():
    topo = Topology(nodes=[Node(id="s", kind="switch")], links=[Link(src="s", dst="t")])
    with pytest.raises(InstanceError) as e:
        check_instance(Instance(topology=topo, jobs=[]))
    assert e.value.field == "topology.links[0].dst"
    inst = _inst()
    inst.telemetry.links.append(LinkTelemetry(src="c0", dst="c1"))
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == "telemetry.links[0]"


@pytest.mark.parametrize(
    ("bad", "field", "text"),
    [
        (Link(src="e0_0", dst="e0_0"), "topology.links[{n}]", "self-loop"),
        (Link(src="h0_0_0", dst="h1_0_0"), "topology.links[{n}]", "two hosts"),
        (Link(src="a0_0", dst="e0_0"), "topology.links[{n}]", "duplicate link"),
        (Link(src="e0_0", dst="nowhere"), "topology.links[{n}].dst", "unknown node"),
        (Link(src="h0_0_0", dst="e1_0"), "topology.links", "exactly one link"),
    ],
)
def test_a_bad_link_among_many_is_named(bad: Link, field: str, text: str) -> None:
    # the links are checked as arrays first (validation._links_look_valid); the error still
    # names the first bad link, as the loop did
    inst = _inst()
    n = len(inst.topology.links)
    inst.topology.links.append(bad)
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == field.format(n=n)
    assert text in e.value.message


def test_telemetry_on_a_missing_link_after_good_entries_is_named() -> None:
    inst = _inst()
    good = [LinkTelemetry(src=ln.dst, dst=ln.src) for ln in inst.topology.links[:5]]
    inst.telemetry.links.extend([*good, LinkTelemetry(src="e0_0", dst="e1_0")])
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == "telemetry.links[5]"
    check_instance(
        inst.model_copy(update={"telemetry": inst.telemetry.model_copy(update={"links": good})})
    )


def test_a_second_record_of_one_direction_is_refused_naming_both() -> None:
    """Two measurements of one link direction: neither is picked silently. The opposite
    direction of the same link is another record, and fine."""
    inst = _inst()
    ln = inst.topology.links[7]
    fwd = LinkTelemetry(src=ln.src, dst=ln.dst, utilization=0.2)
    inst.telemetry.links.extend([fwd, LinkTelemetry(src=ln.dst, dst=ln.src, utilization=0.5)])
    check_instance(inst)
    inst.telemetry.links.append(LinkTelemetry(src=ln.src, dst=ln.dst, utilization=0.9))
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == "telemetry.links[2]"
    assert "telemetry.links[0]" in e.value.message and f"{ln.src}->{ln.dst}" in e.value.message


def test_overlapping_reserved_pools_are_refused_naming_both() -> None:
    """Two pools sharing a slot would be two jobs summing into one register."""
    inst = _inst()
    inst.reserved = {"e0_0": [SlotPool(base=0, size=16), SlotPool(base=16, size=16)]}
    check_instance(inst)  # touching, not sharing
    inst.reserved["e0_0"].append(SlotPool(base=31, size=4))
    with pytest.raises(InstanceError) as e:
        check_instance(inst)
    assert e.value.field == "reserved.e0_0[2]"
    assert "reserved.e0_0[1] (16..31)" in e.value.message


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from agg_optimizer.cli import main; main()", *args],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
    )


def _bad_docs():
    good = _inst().model_dump(mode="json")
    neg = json.loads(json.dumps(good))
    neg["jobs"][0]["update_bytes"] = -5
    empty = json.loads(json.dumps(good))
    empty["jobs"][0]["workers"] = []
    unknown = json.loads(json.dumps(good))
    unknown["jobs"][0]["workers"] = ["ghost"]
    return [
        (neg, "jobs[0].update_bytes"),
        (empty, "jobs[0].workers"),
        (unknown, "jobs[0].workers[0]"),
        ("{not json", "Invalid JSON"),
    ]


@pytest.mark.parametrize(("doc", "field"), _bad_docs())
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, doc, field):
    f = tmp_path / "bad.json"
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    r = _cli("solve", str(f))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert field in r.stderr
