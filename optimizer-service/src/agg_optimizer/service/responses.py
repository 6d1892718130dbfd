"""How the API answers: JSON that never fails on an echoed string, validation errors that
are always JSON, and the documented error bodies of each route."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


def _encodable(value: Any) -> Any:
    """`value` with every string made encodable as UTF-8: a lone surrogate (JSON's
    `"\\ud800"` decodes to one) becomes its escape, `\\ud800`, so an answer that echoes
    the input can always be sent."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value


class SafeJSONResponse(JSONResponse):
    """JSONResponse that never fails on a string it cannot encode (see `_encodable`)."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return super().render(_encodable(content))


def json_safe_error(err: dict[str, Any]) -> dict[str, Any]:
    out = {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type")}
    try:
        json.dumps(err.get("input"), allow_nan=False)
        out["input"] = err.get("input")
    except (TypeError, ValueError):
        out["input"] = repr(err.get("input"))[:100]
    return out


class ErrorOut(BaseModel):
    detail: Any = Field(description="What was wrong: a message, or FastAPI's list of fields.")


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    what = {
        400: "a malformed request",
        401: "the bearer token is missing or wrong",
        404: "no such job, or no placement computed yet",
        409: "the placement cannot be made (the reason names the job and field)",
        413: "the request body is too large, or the job asks too much",
        415: "a mutation without the token must be sent as application/json",
        422: "a field is invalid (loc names it)",
        429: "too many what-if computations; Retry-After says when to try again",
        503: "ONOS or InfluxDB is unavailable",
    }
    return {c: {"model": ErrorOut, "description": what[c]} for c in codes}
