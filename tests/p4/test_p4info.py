"""The committed P4Info declares every P4 name the Python code and the docs use.

agg_agent.p4names holds those names; a rename in p4/ without a rebuild, or without the
same rename there, fails here, on machines with no P4 compiler.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from agg_agent import p4names
from agg_agent.protocol import LANES

from . import p4info

ROOT = Path(__file__).resolve().parents[2]
INFO = p4info.load(ROOT / p4names.P4INFO_PATH)


def _fields(entity: p4info.Message, kind: str) -> list[str]:
    return [f["name"][0] for f in entity.get(kind, [])]  # type: ignore[index]


@pytest.mark.parametrize("table", sorted(p4names.TABLES))
def test_table_and_match_fields(table: str) -> None:
    tables = p4info.names(INFO, "tables")
    assert table in tables, f"P4Info has no table {table}"
    assert _fields(tables[table], "match_fields") == list(p4names.TABLES[table])


@pytest.mark.parametrize("action", sorted(p4names.ACTIONS))
def test_action_and_params(action: str) -> None:
    actions = p4info.names(INFO, "actions")
    assert action in actions, f"P4Info has no action {action}"
    assert _fields(actions[action], "params") == list(p4names.ACTIONS[action])


def test_registers() -> None:
    assert set(p4names.REGISTERS) <= set(p4info.names(INFO, "registers"))


def test_controller_headers() -> None:
    headers = p4info.names(INFO, "controller_packet_metadata")
    for name, metadata in p4names.CONTROLLER_HEADERS.items():
        # Padding fields (`_pad`) are not used by the control plane.
        used = [f for f in _fields(headers[name], "metadata") if not f.startswith("_")]
        assert used == list(metadata)


def test_bmv2_json_agrees_on_header_layouts_and_constants() -> None:
    prog = json.loads((ROOT / p4names.BMV2_JSON_PATH).read_text())
    types = {t["name"]: [f[0] for f in t["fields"]] for t in prog["header_types"]}
    assert types["agg_t"] == [
        "job_id", "slot", "worker_id", "fan_in", "flags", "max_queue", "contributors", "seq", "run"
    ]  # fmt: skip
    from agg_agent.protocol import HEADER_BYTES

    agg = next(t for t in prog["header_types"] if t["name"] == "agg_t")
    assert sum(f[1] for f in agg["fields"]) == 8 * HEADER_BYTES  # the Python struct's size
    stacks = {s["name"]: s for s in prog["header_stacks"]}
    assert len(stacks["agg_values"]["header_ids"]) == LANES
    registers = {r["name"]: r["size"] for r in prog["register_arrays"]}
    assert registers["IngressPipe.aggregation.agg_seq"] == p4names.AGG_SLOTS
    assert registers["IngressPipe.aggregation.agg_run"] == p4names.AGG_SLOTS
    assert registers["IngressPipe.aggregation.agg_values"] == p4names.AGG_SLOTS * LANES


def test_constants_match_the_source() -> None:
    defines = (ROOT / "p4/include/defines.p4").read_text()

    def const(name: str) -> int:
        m = re.search(rf"\b{name}\s*=\s*(0x[0-9A-Fa-f]+|\d+)", defines)
        assert m, f"defines.p4 has no {name}"
        return int(m.group(1), 0)

    assert const("AGG_UDP_PORT") == p4names.AGG_UDP_PORT
    assert const("AGG_SLOTS") == p4names.AGG_SLOTS
    assert const("AGG_JOBS") == p4names.AGG_JOBS
    assert const("INT_DSCP") == p4names.INT_DSCP
    assert const("REPORT_CLONE_SESSION") == p4names.REPORT_CLONE_SESSION
    assert const("CPU_PORT") == p4names.CPU_PORT
    assert re.search(rf"#define AGG_LANES {LANES}\b", defines)


def test_compiled_outputs_come_from_the_committed_source() -> None:
    # `make p4` records the SHA-256 of the sources it compiled (main file, then include/
    # in byte order); editing p4/ without rebuilding fails here.
    files = [ROOT / "p4/innet_agg.p4", *sorted((ROOT / "p4/include").glob("*.p4"))]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    recorded = (ROOT / "p4/build/innet_agg.sources.sha256").read_text().strip()
    assert digest == recorded, "p4/ changed since p4/build/ was compiled: run `make p4`"


def test_docs_use_the_same_names() -> None:
    doc = (ROOT / "docs/onos-aggregation-api.md").read_text()
    used = (*p4names.TABLES, p4names.AGG_SET_JOB, *p4names.AGG_SET_JOB_PARAMS, "job_id")
    for name in used:
        assert f"`{name}`" in doc, f"docs/onos-aggregation-api.md does not name {name}"
