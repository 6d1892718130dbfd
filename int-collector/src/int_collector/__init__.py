"""INT collector: decodes telemetry reports and keeps per-link state in InfluxDB.

Only the package exists so far; the decoder and service are built under their own issue.
"""

__version__ = "0.1.0"
