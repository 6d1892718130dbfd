"""Imported once by `serve`'s fork server before it forks any worker: everything a worker
runs, the compiled receive path loaded from numba's cache (compiled there and then if the
cache is cold), so that every worker, and every restarted one, starts in milliseconds."""

from . import fast, service  # noqa: F401

fast.warm()
