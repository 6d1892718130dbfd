"""Sender windows for the aggregation protocol (docs/congestion.md).

A worker may have at most `window` chunks past its oldest unacknowledged one in flight;
a controller sets that window from what acknowledgements and timeouts tell it:

* `FixedWindow`: the protocol's window as it was, never changed (the baseline).
* `Aimd`: loss-based, TCP Reno's rule: +1 chunk per window of acknowledgements, halved
  on a timeout (at most once per window).
* `Dctcp`: ECN: the parameter server echoes CE marks (FLAG_ECN_ECHO); once per window the
  marked fraction F updates alpha <- (1 - g) alpha + g F and a marked window shrinks by
  alpha / 2 (Alizadeh et al., SIGCOMM 2010); unmarked windows grow by 1.
* `Explicit`: our scheme. Each switch stamps the longest egress queue a chunk waited
  behind (`max_queue`, p4/include/congestion.p4) and the acknowledgement echoes it. A
  bottleneck whose queue holds q packets has the bandwidth-delay product B plus q in
  flight; scaling the window by (B + q_target) / (B + q) leaves q_target. As in HPCC
  (Li et al., SIGCOMM 2019) the scaling applies to a reference window taken once per
  round trip (every sender sharing the queue shrinks by the same factor, so together they
  drain it in one round trip), plus an additive step that converges senders to fair
  shares. A queue at or below the target grows the window by that step per round trip.
  HPCC also uses the links' tx rate; bmv2 has none per packet, so only the queue term is
  used, which is the term that matters for keeping queues short. The window may fall
  below one chunk (to `min_window`): more senders than the path's bandwidth-delay product
  holds packets would otherwise keep a queue of at least senders - BDP whatever the
  feedback says; below one the worker paces, one chunk per round trip / window (as Swift
  does below one packet, Kumar et al., SIGCOMM 2020).

Controllers are pure: time and packets in, window out; `tests/agent/test_congestion.py`
feeds them recorded sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .protocol import FLAG_ECN_ECHO, AggPacket


def _clamp(w: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, w))


@dataclass
class FixedWindow:
    window: float = 16.0
    name: str = field(default="fixed", init=False)

    def on_ack(self, ack: AggPacket) -> None:
        pass

    def on_timeout(self) -> None:
        pass


@dataclass
class Aimd:
    window: float = 4.0
    max_window: float = 64.0
    name: str = field(default="aimd", init=False)
    _since_cut: int = field(default=1 << 30, init=False)  # acknowledgements since the last cut

    def on_ack(self, ack: AggPacket) -> None:
        self.window = _clamp(self.window + 1.0 / self.window, 1.0, self.max_window)
        self._since_cut += 1

    def on_timeout(self) -> None:
        if self._since_cut >= self.window:  # once per window of acknowledgements
            self.window = _clamp(self.window / 2.0, 1.0, self.max_window)
            self._since_cut = 0


@dataclass
class Dctcp:
    window: float = 4.0
    max_window: float = 64.0
    g: float = 1.0 / 16.0
    name: str = field(default="dctcp", init=False)
    alpha: float = field(default=0.0, init=False)
    _acks: int = field(default=0, init=False)
    _marked: int = field(default=0, init=False)

    def on_ack(self, ack: AggPacket) -> None:
        self._acks += 1
        self._marked += bool(ack.flags & FLAG_ECN_ECHO)
        if self._acks < self.window:
            return
        frac = self._marked / self._acks
        self.alpha = (1.0 - self.g) * self.alpha + self.g * frac
        if self._marked:
            self.window *= 1.0 - self.alpha / 2.0
        else:
            self.window += 1.0
        self.window = _clamp(self.window, 1.0, self.max_window)
        self._acks = self._marked = 0

    def on_timeout(self) -> None:
        self.window = _clamp(self.window / 2.0, 1.0, self.max_window)


@dataclass
class Explicit:
    """`bdp`: the path's bandwidth-delay product in packets (chunks); `target`: the queue
    to keep (packets); `step`: the additive increase per round trip; `min_window`: the
    smallest window, below one chunk a pacing rate (`pacing_gap`)."""

    window: float = 4.0
    max_window: float = 64.0
    bdp: float = 4.0
    target: float = 1.0
    step: float = 1.0
    min_window: float = 0.125
    name: str = field(default="explicit", init=False)
    _ref: float = field(default=0.0, init=False)
    _acks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.bdp <= 0 or self.target < 0 or self.step < 0:
            raise ValueError("bdp must be > 0, target and step >= 0")
        if not 0 < self.min_window <= 1:
            raise ValueError(f"min_window: {self.min_window} outside (0, 1]")
        self._ref = self.window

    def on_ack(self, ack: AggPacket) -> None:
        q = float(ack.max_queue)
        if q > self.target:
            w = self._ref * (self.bdp + self.target) / (self.bdp + q) + self.step
        else:
            w = self._ref + self.step
        self.window = _clamp(w, self.min_window, self.max_window)
        self._acks += 1
        if self._acks >= self._ref:  # a round trip of acknowledgements: new reference
            self._ref = self.window
            self._acks = 0

    def on_timeout(self) -> None:
        self.window = _clamp(self.window / 2.0, self.min_window, self.max_window)
        self._ref = self.window
        self._acks = 0


Controller = FixedWindow | Aimd | Dctcp | Explicit


def pacing_gap(window: float, srtt: float | None) -> float:
    """Seconds from one send to the next a window below one chunk allows: one chunk per
    round trip / window. 0 at a window of one or more (the window alone limits), or before
    a round trip was measured."""
    if window >= 1.0 or not srtt:
        return 0.0
    return srtt / window


SCHEMES = ("fixed", "aimd", "dctcp", "explicit")


def make(scheme: str, window: int, **kw: float) -> Controller:
    """A controller by name; `window` is the fixed window, or the most the others open."""
    if scheme == "fixed":
        return FixedWindow(float(window))
    if scheme == "aimd":
        return Aimd(max_window=float(window), **kw)
    if scheme == "dctcp":
        return Dctcp(max_window=float(window), **kw)
    if scheme == "explicit":
        return Explicit(max_window=float(window), **kw)
    raise ValueError(f"scheme: {scheme!r} is not one of {', '.join(SCHEMES)}")
