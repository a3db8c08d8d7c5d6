"""What the answer cache stores and under which key.

The key is a SHA-256 of the request as the chat service validated it, minus what does not
change the answer (``stream``, ``stream_options``, the cache's own controls), together with
who may share it (the scope), the policy that would route it and the checkpoint that policy
would decide with — so a deployed router never answers from its predecessor's choices — and,
for a routed request, the prices of the models it could be routed to, so a reload that
changes them does not serve answers routed under the old ones either.
Responses API requests are translated to chat requests first, so both APIs share entries.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from pricing import ModelPrice

__all__ = ["CachedAnswer", "cache_key", "price_tag"]

FORMAT_VERSION = 1
# Transport fields: the same answer whether it is streamed or not, or asked for with
# OpenRouter's usage accounting (``usage.include``: every answer carries its cost); and
# ``store``/``metadata``, which are not forwarded (gateway.chat_routing), so cannot change it.
_NOT_KEYED = frozenset({"stream", "stream_options", "usage", "store", "metadata"})
_NOT_KEYED_CONTROLS = frozenset({"cache", "tags"})


def cache_key(
    data: dict[str, Any],
    *,
    scope: str,
    policy: str,
    checkpoint: str | None = None,
    routing: dict[str, Any] | None = None,
) -> str:
    """The hex digest naming ``data``'s answer for ``scope`` (a key id or ``*``).
    ``routing`` is what the router decided with that the request may not say itself (the
    trade-off and cap its key's defaults or the gateway's gave it): two keys sharing the
    cache with different defaults must not share answers."""
    keyed = {k: v for k, v in data.items() if k not in _NOT_KEYED}
    controls = keyed.get("xrouter")
    if isinstance(controls, dict):
        # The cache's own controls and the caller's filing tags do not change the answer.
        rest = {k: v for k, v in controls.items() if k not in _NOT_KEYED_CONTROLS}
        if rest:
            keyed["xrouter"] = rest
        else:
            # Nothing left that shapes the answer: keyed as a request without the object.
            del keyed["xrouter"]
    material = {
        "v": FORMAT_VERSION,
        "scope": scope,
        "policy": policy,
        "checkpoint": checkpoint,
        "routing": routing,
        "request": keyed,
    }
    # Sorted keys: two clients that order their JSON differently ask the same question.
    return hashlib.sha256(orjson.dumps(material, option=orjson.OPT_SORT_KEYS)).hexdigest()


def price_tag(price: ModelPrice) -> str:
    """A model's price as a routing policy reads it, the same however the config spells it
    (``0.1`` and ``0.10``): input, output, cached input and reasoning per 1M tokens."""

    def num(d: Decimal | None) -> str:
        return "-" if d is None else format(d.normalize(), "f")

    return "/".join(
        num(d) for d in (price.input, price.output, price.cached_input, price.reasoning)
    )


@dataclass(slots=True, frozen=True)
class CachedAnswer:
    """An answer the gateway served, as it can be served again.

    ``choices`` are chat-completion choices (each with its complete ``message``);
    ``usage`` the original token counts and ``cost_micros`` what the original request paid,
    which a hit saves."""

    request_id: str  # the request whose answer this is (its ledger row)
    created_at: float  # when that answer was served (Unix seconds)
    model: str | None  # the pool model that answered; None: the router itself
    choices: list[dict[str, Any]]
    usage: dict[str, Any]
    cost_micros: int

    @property
    def message(self) -> dict[str, Any]:
        return dict(self.choices[0].get("message") or {"role": "assistant", "content": ""})

    @property
    def finish_reason(self) -> str:
        return str(self.choices[0].get("finish_reason") or "stop")

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": FORMAT_VERSION,
                "request_id": self.request_id,
                "created_at": self.created_at,
                "model": self.model,
                "choices": self.choices,
                "usage": self.usage,
                "cost_micros": self.cost_micros,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> CachedAnswer | None:
        """The stored answer, or None for anything this release cannot serve (another
        format version, a damaged value): a miss, never an error."""
        try:
            d = orjson.loads(raw)
            if not isinstance(d, dict) or d.get("v") != FORMAT_VERSION:
                return None
            choices = d["choices"]
            if not isinstance(choices, list) or not choices:
                return None
            if not all(isinstance(c, dict) and isinstance(c.get("message"), dict) for c in choices):
                return None
            model = d["model"]
            usage = d["usage"]
            return cls(
                request_id=str(d["request_id"]),
                created_at=float(d["created_at"]),
                model=str(model) if model is not None else None,
                choices=choices,
                usage=usage if isinstance(usage, dict) else {},
                cost_micros=int(d["cost_micros"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
