"""What the service's operations raise; the routes map each to its HTTP status."""

from __future__ import annotations


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


class TooLarge(ValueError):
    pass


class BadField(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Unavailable(RuntimeError):
    """A dependency is down; the message says which and what state was left."""


class PoolConflict(Conflict):
    """A job's new slot pool would share registers with another job's on a switch: refused
    where it would be recorded (docs/service.md, "Invariants")."""
