#!/usr/bin/env python3
"""Generate Java constants for every P4 name the app uses, from the committed P4Info.

    gen_p4_constants.py P4INFO DEFINES_P4 OUT_DIR [ONOS_P4INFO]

Writes OUT_DIR/org/innetagg/onos/pipeconf/P4InfoConstants.java (Maven runs this in
generate-sources; the output lives in target/ and is never committed). Names follow
fabric-tna's generated constants: the P4 name upper-cased with `.` -> `_`. Packet-I/O
metadata are prefixed by their controller header (PACKET_IN_INGRESS_PORT), so they cannot
clash with match fields. Sizes and bit widths come along (`*_SIZE`, `*_BITWIDTH`); the
few `const` values of defines.p4 the app needs (CPU_PORT, REPORT_CLONE_SESSION,
INT_FULL_BITMAP_SUPPORTED) are taken from the P4 source.

With ONOS_P4INFO, also writes the P4Info without the fields ONOS 2.7's P4Runtime protos
predate (ONOS_UNKNOWN_FIELDS): p4c writes `initial_default_action` (P4Runtime 1.4), which
ONOS 2.7's P4InfoParser rejects as an unknown field. The field is informational (the
device knows its default actions), so the pipeconf bundles this copy.

Standard library only: the P4Info text format is parsed with a small tokenizer, enough
for what p4c writes (nested messages, scalars, quoted strings).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PACKAGE = "org.innetagg.onos.pipeconf"
CLASS = "P4InfoConstants"
# `const` values of defines.p4 that P4Info does not carry
DEFINES = ("CPU_PORT", "REPORT_CLONE_SESSION", "INT_FULL_BITMAP_SUPPORTED")
# P4Info fields newer than ONOS 2.7's P4Runtime protos
ONOS_UNKNOWN_FIELDS = ("initial_default_action",)

_TOKEN = re.compile(r'\s*(?:(#[^\n]*)|([{}:])|("(?:\\.|[^"\\])*")|([^\s{}:"]+))')


def parse_text_proto(text: str) -> dict:
    """Protobuf text format -> {field: [values]}; a message is a dict of the same shape."""
    tokens = [m for m in _TOKEN.finditer(text) if m.group(1) is None and m.group(0).strip()]
    pos = 0

    def message(end: str | None) -> dict:
        nonlocal pos
        out: dict[str, list] = {}
        while pos < len(tokens):
            tok = tokens[pos]
            if tok.group(2) == "}":
                if end != "}":
                    raise ValueError(f"unexpected '}}' at {tok.start()}")
                pos += 1
                return out
            name = tok.group(4)
            if name is None:
                raise ValueError(f"field name expected at {tok.start()}")
            pos += 1
            if tokens[pos].group(2) == ":":
                pos += 1
            if tokens[pos].group(2) == "{":
                pos += 1
                value: object = message("}")
            else:
                raw = tokens[pos].group(3) or tokens[pos].group(4)
                pos += 1
                value = raw[1:-1] if raw.startswith('"') else raw
            out.setdefault(name, []).append(value)
        if end is not None:
            raise ValueError("unterminated message")
        return out

    return message(None)


def const_name(p4_name: str) -> str:
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", p4_name)  # IngressPipe -> Ingress_Pipe
    return re.sub(r"[^A-Za-z0-9]+", "_", snake).upper().strip("_")


def defines(path: Path) -> dict[str, int]:
    found = {}
    for m in re.finditer(
        r"const\s+\w+(?:<\d+>)?\s+(\w+)\s*=\s*(0x[0-9A-Fa-f]+|\d+)\s*;", path.read_text()
    ):
        found[m.group(1)] = int(m.group(2), 0)
    missing = [d for d in DEFINES if d not in found]
    if missing:
        raise SystemExit(f"{path}: no const {', '.join(missing)}")
    return {d: found[d] for d in DEFINES}


def generate(p4info: dict, consts: dict[str, int], source: str) -> str:
    entries: dict[str, tuple[str, str]] = {}  # constant -> (java type, initializer)

    def add(name: str, jtype: str, init: str) -> None:
        if name in entries and entries[name] != (jtype, init):
            raise SystemExit(
                f"constant {name} would mean two things: {entries[name]} and {(jtype, init)}"
            )
        entries[name] = (jtype, init)

    def first(msg: dict, field: str, default: str = "0") -> str:
        return msg.get(field, [default])[0]

    for t in p4info.get("tables", []):
        name = first(t["preamble"][0], "name")
        c = const_name(name)
        add(c, "PiTableId", f'PiTableId.of("{name}")')
        add(f"{c}_SIZE", "int", first(t, "size"))
        for mf in t.get("match_fields", []):
            mname = first(mf, "name")
            add(const_name(mname), "PiMatchFieldId", f'PiMatchFieldId.of("{mname}")')
            add(f"{const_name(mname)}_BITWIDTH", "int", first(mf, "bitwidth"))
    for a in p4info.get("actions", []):
        name = first(a["preamble"][0], "name")
        add(const_name(name), "PiActionId", f'PiActionId.of("{name}")')
        for p in a.get("params", []):
            pname = first(p, "name")
            add(const_name(pname), "PiActionParamId", f'PiActionParamId.of("{pname}")')
            add(f"{const_name(pname)}_BITWIDTH", "int", first(p, "bitwidth"))
    for kind in ("counters", "direct_counters"):
        for ctr in p4info.get(kind, []):
            name = first(ctr["preamble"][0], "name")
            add(const_name(name), "PiCounterId", f'PiCounterId.of("{name}")')
    for r in p4info.get("registers", []):
        name = first(r["preamble"][0], "name")
        add(const_name(name), "PiRegisterId", f'PiRegisterId.of("{name}")')
        add(f"{const_name(name)}_SIZE", "int", first(r, "size"))
        bit = r["type_spec"][0]["bitstring"][0]["bit"][0]
        add(f"{const_name(name)}_BITWIDTH", "int", first(bit, "bitwidth"))
    for cpm in p4info.get("controller_packet_metadata", []):
        header = first(cpm["preamble"][0], "name")
        for md in cpm.get("metadata", []):
            mname = first(md, "name")
            if mname.startswith("_"):  # padding
                continue
            c = f"{const_name(header)}_{const_name(mname)}"
            add(c, "PiPacketMetadataId", f'PiPacketMetadataId.of("{mname}")')
            add(f"{c}_BITWIDTH", "int", first(md, "bitwidth"))
    for k, v in consts.items():
        add(k, "int", str(v))

    lines = [
        f"// Generated by onos-app/gen_p4_constants.py from {source}. Do not edit.",
        f"package {PACKAGE};",
        "",
        "import org.onosproject.net.pi.model.PiActionId;",
        "import org.onosproject.net.pi.model.PiActionParamId;",
        "import org.onosproject.net.pi.model.PiCounterId;",
        "import org.onosproject.net.pi.model.PiMatchFieldId;",
        "import org.onosproject.net.pi.model.PiPacketMetadataId;",
        "import org.onosproject.net.pi.model.PiRegisterId;",
        "import org.onosproject.net.pi.model.PiTableId;",
        "",
        "/** Every P4 name of the innet_agg pipeline, as its P4Info spells it. */",
        f"public final class {CLASS} {{",
        f"    private {CLASS}() {{",
        "    }",
        "",
    ]
    for name in sorted(entries):
        jtype, init = entries[name]
        lines.append(f"    public static final {jtype} {name} = {init};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def strip_fields(text: str, fields: tuple[str, ...]) -> str:
    """Drops `field { ... }` blocks (p4c writes one per line, braces balanced per line)."""
    out, depth = [], 0
    for line in text.splitlines(keepends=True):
        if depth == 0 and line.strip().split(" ")[0] in fields and line.rstrip().endswith("{"):
            depth = 1
            continue
        if depth:
            depth += line.count("{") - line.count("}")
            continue
        out.append(line)
    return "".join(out)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    p4info_path, defines_path, out_dir = Path(argv[1]), Path(argv[2]), Path(argv[3])
    java = generate(
        parse_text_proto(p4info_path.read_text()), defines(defines_path), p4info_path.name
    )
    out = out_dir.joinpath(*PACKAGE.split("."), f"{CLASS}.java")
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != java:
        out.write_text(java)
    if len(argv) == 5:
        onos = Path(argv[4])
        onos.parent.mkdir(parents=True, exist_ok=True)
        onos.write_text(strip_fields(p4info_path.read_text(), ONOS_UNKNOWN_FIELDS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
