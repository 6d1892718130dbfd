"""The INT entries the ONOS app writes, loaded into bmv2: do reports really come out?

ONOS cannot run here, so the app's IntProgrammable behaviour is driven by a JUnit test the
way ONOS's INT app drives it (`IntProgrammableImplTest.theIntAppsSequenceOnAChainExportedForBmv2`,
run by `make onos-app-test`, which `make test` runs before pytest). It writes every entry
and clone session to `onos-app/target/int-entries.json`; this test loads them into three
bmv2 switches, leaf1 -- spine1 -- leaf2, translating each P4Runtime entry into the
simple_switch_CLI command that means the same (ONOS's bmv2 driver would send it over
P4Runtime). Forwarding (what intents would install) is added here.

    leaf1: 1 host 10.0.0.1, 2 -> spine1:1      spine1: 2 -> leaf2:3
    leaf2: 1 collector 10.0.0.254, 2 host 10.0.0.2
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agg_agent import p4names as n
from int_collector.wire import Decoder

from . import bmv2
from .frames import udp_frame, udp_payload

ENTRIES = bmv2.ROOT / "onos-app" / "target" / "int-entries.json"
REASON = bmv2.skip_reason() or (
    None
    if ENTRIES.exists()
    else f"{ENTRIES.relative_to(bmv2.ROOT)} missing: `make onos-app-test` writes it (JUnit)"
)
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

ANY = "0&&&0"
BMV2_MAX_PRIORITY = (1 << 24) - 1  # bmv2: a lower number wins; P4Runtime: a higher one


def cli_command(entry: dict[str, Any]) -> str:
    """One P4Runtime table entry (as the JUnit test exports it) as a simple_switch_CLI line."""
    table, action = entry["table"], entry["action"]
    params = [hex(entry["params"][p]) for p in n.ACTIONS[action]]
    if entry["default"]:
        return " ".join(["table_set_default", table, action, *params])
    keys = []
    for field in n.TABLES[table]:
        m = entry["match"].get(field)
        if m is None:
            keys.append(ANY)  # a ternary field the entry leaves out: don't care
        elif "mask" in m:
            keys.append(f"{hex(m['value'])}&&&{hex(m['mask'])}")
        else:
            keys.append(hex(m["value"]))
    unknown = set(entry["match"]) - set(n.TABLES[table])
    assert not unknown, f"{table}: no match fields {unknown}"
    line = ["table_add", table, action, *keys, "=>", *params]
    if any("mask" in m for m in entry["match"].values()):
        line.append(str(BMV2_MAX_PRIORITY - entry["priority"]))
    return " ".join(line)


def fwd_to(ip_last: int, port: int) -> str:
    key = [ANY] * 5 + [f"0x0a0000{ip_last:02x}&&&0xffffffff"] + [ANY] * 3
    return f"table_add {n.FWD_TABLE} {n.FWD_SET_EGRESS_PORT} {' '.join(key)} => {port} 10"


def program(sw: bmv2.Bmv2, device: dict[str, Any], forwarding: list[str]) -> None:
    commands = [cli_command(e) for e in device["entries"]]
    commands += [f"mirroring_add {s} {p}" for s, p in device.get("clone_sessions", {}).items()]
    sw.cli(*forwarding, *commands)


def test_the_apps_int_entries_produce_reports_in_bmv2() -> None:
    exported = json.loads(Path(ENTRIES).read_text())
    leaf1, spine1, leaf2 = (exported[f"device:bmv2:{d}"] for d in ("leaf1", "spine1", "leaf2"))
    node = {
        name: next(
            e["params"]["switch_id"] for e in dev["entries"] if e["table"] == n.INT_SWITCH_TABLE
        )
        for name, dev in (("leaf1", leaf1), ("spine1", spine1), ("leaf2", leaf2))
    }
    assert len(set(node.values())) == 3, node

    pre = f"oi{bmv2.os.getpid() % 10000}"
    bmv2.veth_link(f"{pre}x1", f"{pre}y1")
    bmv2.veth_link(f"{pre}x2", f"{pre}y2")
    try:
        with (
            bmv2.Bmv2([1, 2], prefix=f"{pre}a", links={2: f"{pre}x1"}) as a,
            bmv2.Bmv2([1, 2], prefix=f"{pre}s", links={1: f"{pre}y1", 2: f"{pre}x2"}) as s,
            bmv2.Bmv2([1, 2, 3], prefix=f"{pre}b", links={3: f"{pre}y2"}) as b,
        ):
            program(a, leaf1, [fwd_to(2, 2)])
            program(s, spine1, [fwd_to(2, 2)])
            program(b, leaf2, [fwd_to(2, 2)])
            sender, host, collector = (
                bmv2.RawPort(a.host_if(1)),
                bmv2.RawPort(b.host_if(2)),
                bmv2.RawPort(b.host_if(1)),
            )
            try:
                watched = udp_frame(1, 2, 1234, 5000, b"watched", dscp=3)
                other = udp_frame(1, 2, 1234, 5001, b"not on the watchlist")
                sender.send(watched)
                assert host.frames(1.0, want=1) == [watched]  # INT stripped at the sink
                got = collector.frames(1.0, want=1)
                sender.send(other)
                assert host.frames(1.0, want=1) == [other]
                assert collector.frames(0.3, want=1) == []  # no report for an unwatched flow
            finally:
                for r in (sender, host, collector):
                    r.close()
    finally:
        for dev in (f"{pre}x1", f"{pre}x2"):
            bmv2.subprocess.run(["ip", "link", "del", dev], capture_output=True)

    report = leaf2["entries"][[e["table"] for e in leaf2["entries"]].index(n.REPORT_TABLE)]
    payload = udp_payload(got[0], report["params"]["collector_port"]) if got else None
    assert payload is not None, "no report reached the collector's port"
    (r,) = Decoder().decode(payload)
    assert r.node_id == node["leaf2"]
    assert got[0][:6] == (report["params"]["dst_mac"]).to_bytes(6, "big")  # the collector's MAC
    # No sink address from ONOS 2.7's INT app: link-local, named by the node ID.
    assert got[0][26:30] == bytes([169, 254, node["leaf2"] >> 8, node["leaf2"] & 0xFF])
    watch = next(e for e in leaf1["entries"] if e["table"] == n.INT_WATCHLIST_TABLE)
    assert r.remaining_hop_count == watch["params"]["remaining_hop_cnt"] - 3
    assert r.instruction_bitmap == 0xF000  # node ID, L1 ports (always) + latency, queue (asked)
    assert [(h.node_id, h.ingress_port, h.egress_port) for h in r.hops()] == [
        (node["leaf2"], 3, 2),
        (node["spine1"], 1, 2),
        (node["leaf1"], 1, 2),
    ]
    assert all(h.hop_latency is not None and h.queue_occupancy is not None for h in r.hops())
