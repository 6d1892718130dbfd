"""The ONOS stand-in of the service tests: `agg_optimizer.demo.onos_rest.OnosRest` (the part of
ONOS 2.7's REST API the service uses, over real HTTP) serving the recorded bodies of a real
ONOS under `tests/fixtures/onos`; the aggregation app's resource answers 404 (not installed)
unless a test sets `aggregation` to a dict (the service tests' `onos` fixture does).

The app's traffic-class resource (`/onos/innet-agg/priority/{job}`) answers as the app does
in a real ONOS 2.7 (`test_standin_parity.py` compares them; the checks are in OnosRest, so
the demo's simulated fabric answers the same). Which devices run the innet-agg pipeconf is
`pipeconf_devices`; None (the default) means every device, as on the recorded fabric of
bmv2 switches.

For machines without the ONOS 2.7.0 built from source (docs/service.md); where that ONOS
exists, `test_onos_real.py` runs the service against it and `test_standin_parity.py`
compares the answers of both to the same requests.
"""

from __future__ import annotations

import json
from pathlib import Path

from agg_optimizer.demo.onos_rest import APP_ID_NOT_FOUND, PIPECONF, OnosRest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "onos"

__all__ = ["APP_ID_NOT_FOUND", "PIPECONF", "StandinOnos"]


class StandinOnos(OnosRest):
    def __init__(self, port: int = 0) -> None:
        super().__init__(
            *(
                json.loads((FIXTURES / f"{name}.json").read_text())
                for name in ("devices", "links", "hosts")
            ),
            port=port,
        )
