"""Fault injection for the replay upstream: the fault syntax, the per-model fault queue and
the request counters.

One syntax serves the three ways a fault reaches a request (the ``x-replay-fault`` header,
the ``/_replay/faults`` control API, and a ``[[replay:<fault>]]`` marker in the last user
message):

``status=<code>``     answer with an OpenAI-shaped error and that HTTP status (400-599)
``rate-limit=<s>``    answer 429 with ``retry-after: <s>``, as a provider's rate limit does
``timeout[=<s>]``     hold the request far longer than any client timeout (default 300 s)
``cut-stream=<n>``    stream n content events, then close the connection without [DONE]
``drop``              close the connection without sending a response
``latency=<ms>``      answer normally after an extra delay (slow, not failing)
``no-usage``          answer normally but report no ``usage`` (as some servers do)
``bad-event=<n>``     a malformed answer: a stream sends n content events, then an event
                      that is JSON but not a chunk (``{"choices": [null]}``); a plain
                      request gets that as its body, with a 200
``bad-usage``         a stream complete to its finish_reason whose usage chunk is that
                      malformed event (a plain request: as bad-event)
``no-stream``         answer a stream request with the whole completion as JSON, as a server
                      that ignores ``stream: true`` does (a plain request: answered normally)
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from dataclasses import dataclass
from typing import Literal

FaultKind = Literal[
    "status",
    "rate-limit",
    "timeout",
    "cut-stream",
    "drop",
    "latency",
    "no-usage",
    "bad-event",
    "bad-usage",
    "no-stream",
]

DEFAULT_TIMEOUT_S = 300.0
ANY_MODEL = "*"
_MARKER_RE = re.compile(r"\[\[replay:([^\]]*)\]\]")
_MARKER_PREFIX = "[[replay:"


class FaultSyntaxError(ValueError):
    """A fault string does not follow the documented syntax."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind
    # status code (status), seconds (timeout, rate-limit), event count (cut-stream),
    # milliseconds (latency)
    value: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Fault:
        name, sep, arg = text.strip().partition("=")
        name = name.strip().lower()
        arg = arg.strip()
        try:
            if name == "drop" and not sep:
                return cls("drop")
            if name == "no-usage" and not sep:
                return cls("no-usage")
            if name == "bad-usage" and not sep:
                return cls("bad-usage")
            if name == "no-stream" and not sep:
                return cls("no-stream")
            if name == "timeout":
                seconds = float(arg) if sep else DEFAULT_TIMEOUT_S
                if not 0 < seconds < math.inf:
                    raise FaultSyntaxError("timeout must be a positive number of seconds")
                return cls("timeout", seconds)
            if name == "rate-limit" and sep:
                seconds = float(arg)
                if not 0 <= seconds < math.inf:
                    raise FaultSyntaxError("rate-limit needs a finite retry-after >= 0")
                return cls("rate-limit", seconds)
            if name == "status" and sep:
                code = int(arg)
                if not 400 <= code <= 599:
                    raise FaultSyntaxError("status must be an HTTP error code (400-599)")
                return cls("status", code)
            if name in ("cut-stream", "bad-event") and sep:
                events = int(arg)
                if events < 0:
                    raise FaultSyntaxError(f"{name} needs a count >= 0")
                return cls(name, events)  # type: ignore[arg-type]
            if name == "latency" and sep:
                ms = float(arg)
                if not 0 <= ms < math.inf:
                    raise FaultSyntaxError("latency must be a finite number >= 0")
                return cls("latency", ms)
        except ValueError as exc:
            if isinstance(exc, FaultSyntaxError):
                raise
            raise FaultSyntaxError(f"bad fault argument in {text!r}") from None
        raise FaultSyntaxError(
            f"unknown fault {text!r}; expected status=<code>, rate-limit=<s>, timeout[=<s>], "
            "cut-stream=<n>, drop, latency=<ms>, no-usage, bad-event=<n>, bad-usage or no-stream"
        )

    def __str__(self) -> str:
        if self.kind in ("drop", "no-usage", "bad-usage", "no-stream"):
            return self.kind
        if self.kind in ("status", "cut-stream"):
            return f"{self.kind}={int(self.value)}"
        return f"{self.kind}={self.value:g}"


def split_marker(text: str) -> tuple[str, str | None]:
    """Remove a ``[[replay:<fault>]]`` marker from a prompt; returns (prompt, fault text).

    The marker is stripped so a known prompt carrying a marker still replays its record."""
    if _MARKER_PREFIX not in text:  # the common case: no regex work at all
        return text, None
    m = _MARKER_RE.search(text)
    if m is None:
        return text, None
    return text[: m.start()] + text[m.end() :], m.group(1)


class FaultQueue:
    """Faults queued through the control API, consumed one per request: first those queued
    for the requested model, then those queued for every model (``*``)."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[Fault]] = {}

    def push(self, model: str, fault: Fault, count: int = 1) -> None:
        self._queues.setdefault(model, deque()).extend([fault] * count)

    def pop(self, model: str) -> Fault | None:
        if not self._queues:  # fast path: nothing queued
            return None
        for key in (model, ANY_MODEL):
            q = self._queues.get(key)
            if q:
                fault = q.popleft()
                if not q:
                    del self._queues[key]
                return fault
        return None

    def clear(self) -> int:
        n = sum(len(q) for q in self._queues.values())
        self._queues.clear()
        return n

    def snapshot(self) -> dict[str, list[str]]:
        return {model: [str(f) for f in q] for model, q in self._queues.items()}


class ReplayStats:
    """Request counters; tests read them to count retries and fallbacks behind a gateway."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.total = 0
        # Streams whose client went away before the end: a gateway that cancels its
        # upstream call when its own client disconnects shows up here.
        self.streams_abandoned = 0

    def count_request(self, model: str | None) -> None:
        self.total += 1
        if model is not None:
            self.requests[model] += 1

    def count_fault(self, fault: Fault) -> None:
        self.faults[fault.kind] += 1

    def reset(self) -> None:
        self.requests.clear()
        self.faults.clear()
        self.total = 0
        self.streams_abandoned = 0

    def snapshot(self) -> dict[str, object]:
        return {
            "total": self.total,
            "requests": dict(self.requests),
            "faults": dict(self.faults),
            "streams_abandoned": self.streams_abandoned,
        }
