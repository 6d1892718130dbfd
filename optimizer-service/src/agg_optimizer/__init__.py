"""Placement of in-network aggregation for data-parallel training jobs."""

__version__ = "0.1.0"
