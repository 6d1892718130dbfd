"""Decentralized training's peer selection: NetMax and its baselines (`selection`), and
their run on the simulated fabric as links change (`dynamics`)."""

from agg_optimizer.peers.selection import POLICIES, PeerError, PeerPlan, pair_times, plan

__all__ = ["POLICIES", "PeerError", "PeerPlan", "pair_times", "plan"]
