"""A small reader of the P4Info text format (protobuf text format), enough for the checks.

Messages become dicts of lists (every field may repeat); scalars stay strings or ints.
"""

from __future__ import annotations

import re
from pathlib import Path

_TOKEN = re.compile(
    r"\s*(?:#[^\n]*\n"  # a comment
    r"|([A-Za-z_][\w.]*)\s*(:)?\s*"  # a field name, or an enum value
    r"|(\{)|(\})"
    r'|("(?:[^"\\]|\\.)*")'  # a string
    r"|(-?\w+))"  # a number
)

Message = dict[str, list["Message | str | int"]]


def parse(text: str) -> Message:
    stack: list[Message] = [{}]
    key: str | None = None
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"p4info: cannot read at byte {pos}: {text[pos : pos + 30]!r}")
            break
        pos = m.end()
        name, _colon, opened, closed, string, scalar = m.groups()
        if not any(m.groups()):
            continue  # a comment
        if opened:
            child: Message = {}
            stack[-1].setdefault(key or "", []).append(child)
            stack.append(child)
            key = None
        elif closed:
            stack.pop()
        elif string is not None:
            stack[-1].setdefault(key or "", []).append(string[1:-1])
            key = None
        elif name is not None and key is None:
            key = name
        else:
            value = scalar if scalar is not None else name
            stack[-1].setdefault(key or "", []).append(int(value) if value.isdigit() else value)
            key = None
    return stack[0]


def load(path: Path) -> Message:
    return parse(path.read_text())


def names(info: Message, kind: str) -> dict[str, Message]:
    """Entities of `kind` (tables, actions, registers, ...) by their preamble name."""
    return {e["preamble"][0]["name"][0]: e for e in info.get(kind, [])}  # type: ignore[index]
