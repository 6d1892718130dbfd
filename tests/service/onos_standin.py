"""The ONOS stand-in of the service tests: `agg_optimizer.sim.onos_rest.OnosRest` (the part of
ONOS 2.7's REST API the service uses, over real HTTP) serving the recorded bodies of a real
ONOS under `tests/fixtures/onos`; the aggregation app's resource answers 404 (not installed)
unless a test sets `aggregation` to a dict (the service tests' `onos` fixture does).

The app's traffic-class resource (`/onos/innet-agg/priority/{job}`) answers here as the app
does in a real ONOS 2.7 (`test_standin_parity.py` compares them): the same checks in the same
order, the same statuses and messages (`JobClass`, `TrafficClassManager`, `WebErrors`), the
posted document echoed with the switches written and `p4_job_id`. Which devices run the
innet-agg pipeconf is `pipeconf_devices`; None (the default) means every device, as on the
recorded fabric of bmv2 switches.

For machines without the ONOS 2.7.0 built from source (docs/service.md); where that ONOS
exists, `test_onos_real.py` runs the service against it and `test_standin_parity.py`
compares the answers of both to the same requests.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

from agg_optimizer.sim.onos_rest import APP_ID_NOT_FOUND, OnosRest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onos"
PRIORITY_PATH = "/onos/innet-agg/priority/"
PIPECONF = "org.innetagg.bmv2"  # PipeconfLoader.PIPECONF_ID
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # JobPlacement.JOB_ID
JOB_NUMBERS = 256  # JobNumberRegistry.JOB_NUMBERS (agg_job's size)
MAX_CLASS = 7

__all__ = ["APP_ID_NOT_FOUND", "PIPECONF", "StandinOnos"]


def _bad(status: int, message: str) -> tuple[int, Any]:
    return status, {"code": status, "message": message}


def _java(value: Any) -> str:
    """A JSON value as Jackson's JsonNode.toString() writes it (`null` for a missing one)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class StandinOnos(OnosRest):
    def __init__(self, port: int = 0) -> None:
        super().__init__(
            *(
                json.loads((FIXTURES / f"{name}.json").read_text())
                for name in ("devices", "links", "hosts")
            ),
            port=port,
        )
        # Ids of the devices running the innet-agg pipeconf; None: every device.
        self.pipeconf_devices: set[str] | None = None
        self.job_numbers: dict[str, int] = {}  # job -> its number at the switches

    def start(self) -> None:
        """As OnosRest, but what Jersey and the app's resource answer before the document
        is looked at, for a POST to the traffic-class resource: 415 for a body declared of
        another type than JSON, 400 naming `body` for one that does not parse as JSON (a
        blank body is no document, refused as one)."""
        super().start()
        assert self.server is not None
        rest, base = self, self.server.RequestHandlerClass

        class Handler(base):  # type: ignore[valid-type,misc]
            def _handle(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                ours = (
                    method == "POST"
                    and self.path.startswith(PRIORITY_PATH)
                    and rest.aggregation is not None
                    and self.headers.get("Authorization", "") == rest.credentials
                )
                refused = self._refusal(raw) if ours else None
                if refused is not None:
                    self._send(*refused)
                    return
                # OnosRest's handler reads the body again, from here.
                socket_file = self.rfile
                self.rfile = io.BytesIO(b"" if ours and not raw.strip() else raw)
                try:
                    super()._handle(method)
                finally:
                    self.rfile = socket_file

            def _refusal(self, raw: bytes) -> tuple[int, Any] | None:
                # Jersey: the resource @Consumes JSON; a body of another declared type is
                # 415 (Jetty's HTML page), one of no declared type is read.
                media = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
                if media not in ("", "application/json"):
                    return 415, None
                try:
                    if raw.strip():
                        json.loads(raw)
                except ValueError as e:
                    return _bad(400, f"body: not JSON ({getattr(e, 'msg', e)})")
                return None

        self.server.RequestHandlerClass = Handler

    def _ours(self, device: dict[str, Any]) -> bool:
        if self.pipeconf_devices is None:
            return True
        return device["id"] in self.pipeconf_devices

    def _priority(self, method: str, job: str, body: Any) -> tuple[int, Any]:
        if method == "GET":
            doc = self.priority.get(job)
            if doc is None:
                return _bad(404, f"job: no traffic class for '{job}'")
            return 200, doc
        if method == "DELETE":
            if self.priority.pop(job, None) is not None:
                self.job_numbers.pop(job, None)
                self._changes.append(("priority", job, None))
            return 204, None
        if method != "POST":
            return 405, None
        # JobClass.decode: everything that needs no devices, in this order.
        if not JOB_ID.fullmatch(job):
            return _bad(400, f"job: '{job}' does not match {JOB_ID.pattern}")
        if not isinstance(body, dict):
            return _bad(400, "body: a traffic-class document (JSON object) expected")
        jid = body.get("job_id")
        if not isinstance(jid, str) or not jid:
            return _bad(400, "job_id: a non-empty string expected")
        if jid != job:
            return _bad(400, f"job_id: '{jid}' is not the job of the path, '{job}'")
        cls = body.get("priority_class")
        if isinstance(cls, bool) or not isinstance(cls, int) or not 0 <= cls <= MAX_CLASS:
            got = _java(cls)
            return _bad(400, f"priority_class: an integer 0..{MAX_CLASS} expected, got {got}")
        listed = body.get("switches")
        if listed is not None:
            if not isinstance(listed, list):
                return _bad(400, "switches: a list of device ids expected")
            for i, sw in enumerate(listed):
                if not isinstance(sw, str) or not sw:
                    return _bad(400, f"switches[{i}]: a device id (string) expected")
                if sw in listed[:i]:
                    before = listed.index(sw)
                    return _bad(400, f"switches[{i}]: '{sw}' is listed twice (switches[{before}])")
        # TrafficClassManager: the listed switches (every 400 before any 503), or by default
        # every available device of ours, by id.
        devices = {d["id"]: d for d in self.devices.get("devices", [])}
        if listed is None:
            switches = sorted(
                i for i, d in devices.items() if d.get("available", True) and self._ours(d)
            )
        else:
            for i, sw in enumerate(listed):
                if sw not in devices:
                    return _bad(400, f"switches[{i}]: unknown device '{sw}'")
                if not self._ours(devices[sw]):
                    return _bad(
                        400,
                        f"switches[{i}]: device '{sw}' does not run the innet-agg pipeconf"
                        f" ({PIPECONF})",
                    )
            for i, sw in enumerate(listed):
                if not devices[sw].get("available", True):
                    return _bad(503, f"switches[{i}]: device '{sw}' is not available")
            switches = list(listed)
        number = self.job_numbers.get(job)
        if number is None:
            free = sorted(set(range(JOB_NUMBERS)) - set(self.job_numbers.values()))
            if not free:
                return _bad(503, f"job: all {JOB_NUMBERS} job numbers are in use")
            number = self.job_numbers[job] = free[0]
        new = job not in self.priority
        doc = {**body, "switches": switches, "p4_job_id": number}
        self.priority[job] = doc
        self._changes.append(("priority", job, doc))
        return (201 if new else 200), doc
