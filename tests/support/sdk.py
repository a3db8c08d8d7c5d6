"""Reading the gateway's additions to OpenAI SDK objects in tests."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def extra(obj: BaseModel | None) -> dict[str, Any]:
    """The fields an OpenAI SDK object carries beyond OpenAI's schema (``model_extra``: the
    gateway's ``xrouter`` block, ``usage.cost``), asserting that the object is there (a
    response's ``usage`` is optional in the SDK's types)."""
    assert obj is not None
    assert obj.model_extra is not None  # the SDK's models allow extra fields
    return obj.model_extra
