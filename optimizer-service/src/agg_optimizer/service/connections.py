"""The HTTP server's connections, bounded (docs/service.md, "Connections"): uvicorn closes
a connection idle after a response (`timeout_keep_alive`) and answers 503 past
`limit_concurrency`, but a connection that sends nothing, or half a request head, is held
for as long as the client likes. This protocol gives every request head a deadline from
the moment the connection opens or the head begins."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEAD_TIMEOUT_S = 10.0  # the default; `Settings.http_head_timeout_s`


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head deadline (`head_timeout_s`): the
    connection is closed, with nothing sent, when a head is not complete in time."""

    head_timeout_s = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._head: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head()

    def on_headers_complete(self) -> None:
        self._disarm_head()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        if self._head is None:
            self._head = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _disarm_head(self) -> None:
        if self._head is not None:
            self._head.cancel()
            self._head = None

    def _head_expired(self) -> None:
        self._head = None
        if not self.transport.is_closing():
            self.transport.close()


def protocol(head_timeout_s: float) -> type[BoundedHttpProtocol]:
    """The protocol class with this deadline (uvicorn builds one instance per connection)."""
    return type("BoundedHttp", (BoundedHttpProtocol,), {"head_timeout_s": head_timeout_s})
