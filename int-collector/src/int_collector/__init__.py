"""INT collector: decodes telemetry reports and keeps per-link state in InfluxDB.

Modules: `wire` (decoder and encoder), `state` (derived link/flow state, change detection),
`storage` (bounded backlog to InfluxDB), `service` (receive loop, /metrics, /healthz),
`generator` (synthetic fabric), `settings`, `cli`.
"""

__version__ = "0.1.0"
