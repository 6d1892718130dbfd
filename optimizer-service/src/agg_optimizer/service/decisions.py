"""Placement decisions as points in InfluxDB (`decisions_bucket`), written from a thread of
their own so that a slow or hung InfluxDB never holds the apply lock."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from agg_optimizer.service.settings import Settings
from agg_optimizer.service.telemetry import InfluxUnavailable, TelemetryReader

log = logging.getLogger(__name__)


class Decisions:
    def __init__(
        self, settings: Settings, influx: TelemetryReader, count: Callable[[str], None]
    ) -> None:
        self.s, self.influx, self._count = settings, influx, count
        self._decisions: queue.Queue[tuple] = queue.Queue(maxsize=1000)
        self._decision_thread: threading.Thread | None = None

    def record(self, jid: str, strat: str, jp: Any, trigger: str) -> None:
        item = (jid, strat, [a.switch for a in jp.aggregators], jp.predicted_cct_s, trigger)
        try:
            self._decisions.put_nowait(item)
        except queue.Full:
            self._count("decisions_unwritten")
            return
        if self._decision_thread is None:
            self._decision_thread = threading.Thread(
                target=self._write, name="decisions", daemon=True
            )
            self._decision_thread.start()

    def _write(self) -> None:
        bucket = self.s.decisions_bucket or self.s.influx_bucket
        while True:
            item = self._decisions.get()
            if item is None:
                return
            try:
                self.influx.write_decision(bucket, *item)
            except InfluxUnavailable as e:
                log.warning("decision for %s not written: %s", item[0], e)
                self._count("decisions_unwritten")
            finally:
                self._decisions.task_done()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued decision is written (or failed); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._decisions.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)
        return not self._decisions.unfinished_tasks
