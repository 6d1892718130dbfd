"""One bmv2 `simple_switch_grpc` under the real ONOS 2.7.0, through our pipeconf: ONOS pushes
the pipeline and its own entries (which bmv2 must accept: ONOS reads them back, so ADDED
means the switch holds them), learns hosts from our packet-in, the INT app drives our
`IntProgrammable` (node ID, published as the `intSwitchId` annotation; clone group and
collector entry; watchlist), and a placement's `agg_job` entry lands on the switch.

Needs root, iproute2, and bmv2 with P4Runtime (`simple_switch_grpc`, built outside the
repository into /opt/p4); skipped, with the reason, without them or the ONOS built from source.
"""

from __future__ import annotations

import json
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agg_optimizer.service import onosd
from p4 import bmv2

DEVICE = "device:bmv2:it1"
PIPECONF = "org.innetagg.bmv2"
ONOS_APP = "org.innetagg.app"
INT_APP = "org.onosproject.inbandtelemetry"
HOST_MAC = {1: "00:00:00:00:0A:01", 2: "00:00:00:00:0A:02"}


def arp_request(i: int) -> bytes:
    """Host i (10.0.0.i) asks who has 10.0.0.254: ONOS's host provider learns host i."""
    mac = bytes.fromhex(HOST_MAC[i].replace(":", ""))
    body = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + bytes([10, 0, 0, i])
    return b"\xff" * 6 + mac + b"\x08\x06" + body + bytes(6) + bytes([10, 0, 0, 254])


@pytest.fixture(scope="module")
def device(onos_real: onosd.OnosServer, tmp_path_factory) -> Iterator[dict[str, Any]]:
    why = bmv2.grpc_skip_reason()
    if why:
        pytest.skip(why)
    binary = bmv2.tool("simple_switch_grpc")
    assert binary
    for i in (1, 2):
        bmv2.veth_link(f"iat1s{i}", f"iat1h{i}")
    grpc_port = bmv2.free_port()
    log = tmp_path_factory.mktemp("bmv2") / "switch.log"
    proc = subprocess.Popen(
        [
            binary,
            *("--no-p4", "--device-id", "1", "--thrift-port", str(bmv2.free_port())),
            *("-i", "1@iat1s1", "-i", "2@iat1s2", "--log-file", str(log.with_suffix(""))),
            "--",
            *("--grpc-server-addr", f"127.0.0.1:{grpc_port}", "--cpu-port", "255"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ports = {i: bmv2.RawPort(f"iat1h{i}") for i in (1, 2)}
    onos_real.fast_readback()
    try:
        onosd.wait_for(
            lambda: bmv2.listening(grpc_port) or proc.poll() is not None, 20, "gRPC server"
        )
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        cfg = {
            "devices": {
                DEVICE: {
                    "basic": {
                        "managementAddress": f"grpc://127.0.0.1:{grpc_port}?device_id=1",
                        "driver": "bmv2",
                        "pipeconf": PIPECONF,
                    }
                }
            }
        }
        r = onos_real.request("POST", "/network/configuration", json=cfg)
        assert r.status_code == 200, r.text
        onosd.wait_for(
            lambda: onos_real.request("GET", f"/devices/{DEVICE}").json().get("available"),
            90,
            "the bmv2 device available in ONOS",
        )
        yield {"onos": onos_real, "ports": ports, "proc": proc, "netcfg": cfg}
    finally:
        for intent in onos_real.request("GET", "/onos/int/intIntent").json().get("IntIntents", []):
            onos_real.request("DELETE", f"/onos/int/intIntent/{intent['id']}")
        onos_real.request("DELETE", f"/network/configuration/apps/{INT_APP}")
        for p in ports.values():
            p.close()
        proc.terminate()
        proc.wait(10)
        # The device goes before its netcfg: without the netcfg ONOS cannot build the
        # pipeconf's merged driver of a device it still lists, and GET /devices answers 404.
        onos_real.request("DELETE", f"/devices/{DEVICE}")
        onos_real.request("DELETE", f"/network/configuration/devices/{DEVICE}")
        onosd.wait_for(
            lambda: (
                onos_real.request("GET", "/devices").status_code == 200
                and DEVICE not in {d["id"] for d in onos_real.get("/devices")["devices"]}
            ),
            30,
            "the device gone and /devices answering",
        )
        for i in (1, 2):
            subprocess.run(["ip", "link", "del", f"iat1s{i}"], capture_output=True)


def flows(onos: onosd.OnosServer, table_suffix: str = "") -> list[dict]:
    return [
        f
        for f in onos.get(f"/flows/{DEVICE}").get("flows", [])
        if str(f.get("tableName", "")).endswith(table_suffix)
    ]


def test_onos_pushes_our_pipeline_and_bmv2_holds_its_entries(device: dict) -> None:
    onos = device["onos"]
    dev = onos.get(f"/devices/{DEVICE}")
    assert dev["driver"].startswith("bmv2") and PIPECONF in dev["driver"]
    table0 = onosd.wait_for(lambda: flows(onos, ".table0"), 60, "ONOS's entries in table0")
    onosd.wait_for(
        lambda: {f["state"] for f in flows(onos, ".table0")} == {"ADDED"},
        60,
        f"table0 entries ADDED, states: {[f['state'] for f in table0]}",
    )


def test_hosts_are_learned_through_our_packet_in(device: dict) -> None:
    onos = device["onos"]
    onosd.wait_for(lambda: flows(onos, ".table0"), 60, "the ARP punt entry")

    def learned() -> bool:
        for i in (1, 2):
            device["ports"][i].send(arp_request(i))
        hosts = {h["mac"].upper(): h for h in onos.get("/hosts")["hosts"]}
        return all(mac in hosts for mac in HOST_MAC.values())

    onosd.wait_for(learned, 60, "both hosts learned")
    hosts = {h["mac"].upper(): h for h in onos.get("/hosts")["hosts"]}
    for i, mac in HOST_MAC.items():
        loc = hosts[mac]["locations"][0]
        assert (loc["elementId"], loc["port"]) == (DEVICE, str(i))


def report_config(onos: onosd.OnosServer, collector_port: int) -> None:
    report = {"collectorIp": "10.0.0.2", "collectorPort": collector_port}
    r = onos.request(
        "POST",
        "/network/configuration",
        json={"apps": {INT_APP: {"report": {**report, "minFlowHopLatencyChangeNs": 0}}}},
    )
    assert r.status_code == 200, r.text


def collector_port(onos: onosd.OnosServer) -> int | None:
    """The UDP port of the report_collector default entry bmv2 holds (ADDED), if any."""
    for f in flows(onos, ".report_collector"):
        if f["state"] != "ADDED":
            continue
        for inst in f.get("treatment", {}).get("instructions", []):
            for param in inst.get("actionParams", {}) and [inst["actionParams"]]:
                if "collector_port" in param:
                    return int(param["collector_port"], 16)
    return None


def test_the_int_app_drives_our_int_programmable(device: dict) -> None:
    onos = device["onos"]
    report_config(onos, 32766)
    intent = {
        "selector": {
            "criteria": [
                {"type": "ETH_TYPE", "ethType": "0x800"},
                {"type": "UDP_DST", "udpPort": 48879},
            ]
        },
        "metadataTypes": ["SWITCH_ID", "L1_PORT_ID", "HOP_LATENCY", "QUEUE_OCCUPANCY"],
        "headerType": "HOP_BY_HOP",
        "telemetryMode": "INBAND_TELEMETRY",
        # A string: ONOS 2.7's IntIntentCodec reads a list as one text node, "" (400).
        "reportTypes": "TRACKED_FLOW",
    }
    r = onos.request("POST", "/onos/int/intIntent", json=intent)
    assert r.status_code < 300, r.text
    onosd.wait_for(
        lambda: onos.get(f"/devices/{DEVICE}")["annotations"].get("intSwitchId"),
        60,
        "the intSwitchId annotation",
    )
    for table in (".int_switch", ".report_collector", ".int_watchlist"):
        onosd.wait_for(
            lambda t=table: [f for f in flows(onos, t) if f["state"] == "ADDED"],
            60,
            f"{table} entry ADDED: {json.dumps(flows(onos, table))[:500]}",
        )
    groups = onosd.wait_for(
        lambda: [
            g
            for g in onos.get(f"/groups/{DEVICE}").get("groups", [])
            if g.get("type") == "CLONE" and g.get("state") == "ADDED"
        ],
        60,
        "the report clone group ADDED",
    )
    assert groups[0]["buckets"], groups


def test_a_placement_lands_on_the_switch(device: dict) -> None:
    onos = device["onos"]
    test_hosts_are_learned_through_our_packet_in(device)
    h1, h2 = (f"{HOST_MAC[i]}/None" for i in (1, 2))
    doc = {
        "strategy": "agg",
        "jobs": [
            {
                "job_id": "it-bmv2",
                "aggregators": [
                    {
                        "switch": DEVICE,
                        "children": [h1],
                        "fan_in": 1,
                        "next_hop": h2,
                        "pool": {"base": 0, "size": 64},
                    }
                ],
                "worker_paths": {h1: [h1, DEVICE, h2]},
            }
        ],
    }
    url = "/onos/innet-agg/aggregation/it-bmv2"
    try:
        r = onos.request("POST", url, json=doc)
        assert r.status_code == 201, r.text
        onosd.wait_for(
            lambda: [f for f in flows(onos, ".agg_job") if f["state"] == "ADDED"],
            60,
            f"agg_job ADDED: {json.dumps(flows(onos, '.agg_job'))[:500]}",
        )
    finally:
        assert onos.request("DELETE", url).status_code == 204
    onosd.wait_for(lambda: not flows(onos, ".agg_job"), 60, "agg_job removed")


def test_after_an_upgrade_of_the_app_devices_run_its_new_behaviours(device: dict) -> None:
    # ONOS 2.7 keeps the driver it merged from our pipeconf after the app is uninstalled and
    # hands it to devices that connect later; the app drops it (dropMergedDrivers), else the
    # device runs the old bundle's IntProgrammable, whose service lookups fail, and INT
    # changes are lost. A device connected through the upgrade keeps the driver its ONOS
    # Device object bound (not ours to reach): it gets the new one when it reconnects.
    onos = device["onos"]
    test_the_int_app_drives_our_int_programmable(device)
    onosd.wait_for(lambda: collector_port(onos) == 32766, 30, "the collector port in bmv2")
    oar = sorted((Path(__file__).resolve().parents[2] / "onos-app" / "target").glob("*.oar"))[-1]
    onos.install_app(oar, ONOS_APP, probe="/onos/innet-agg/aggregation/absent")
    # Until it is removed, the device still runs the old bundle's behaviour, whose INT init
    # may fail in that window (timing: the INT app's periodic task); what we assert is after.
    assert onos.request("DELETE", f"/devices/{DEVICE}").status_code == 200
    removed = f"Device {DEVICE} administratively removed"
    onosd.wait_for(lambda: removed in onos.karaf_log(), 30, "the removal in the log")
    logged = onos.karaf_log().rindex(removed)
    r = onos.request("POST", "/network/configuration", json=device["netcfg"])
    assert r.status_code == 200, r.text
    onosd.wait_for(
        lambda: onos.request("GET", f"/devices/{DEVICE}").json().get("available"),
        60,
        "the device back",
    )
    test_hosts_are_learned_through_our_packet_in(device)  # removed with the device
    report_config(onos, 32767)
    onosd.wait_for(
        lambda: collector_port(onos) == 32767,
        60,
        f"the new collector port in bmv2: {json.dumps(flows(onos, '.report_collector'))[:800]}",
    )
    assert "INT init failed" not in onos.karaf_log()[logged:]
