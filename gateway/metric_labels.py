"""Bounded label values for the gateway's metrics.

A label fed from request data could otherwise grow without limit (every typo'd model name a
new time series), so models and policies are checked against the sets the config names (at
start-up, plus those each reload or deploy brings, up to a fixed room) and anything else is
reported as ``"other"``; a request no model answered, or that failed before a policy was
resolved, is ``"none"``. Free-form vocabularies owned by other components (error kinds,
spill reasons) accept a few distinct values first come and fold the rest into ``"other"``.
"""

from __future__ import annotations

from collections.abc import Iterable

OTHER = "other"
NONE = "none"


def status_class(status: int | str) -> str:
    try:
        code = int(status)
    except (TypeError, ValueError):
        return OTHER
    return f"{code // 100}xx" if 100 <= code <= 599 else OTHER


# What callers pass for "no model answered" and "no policy was resolved" (the ledger's words
# for them): their label is "none", as for an empty value, not "other" (an unknown name).
_NONE_SENTINELS = frozenset({NONE, "unresolved"})


class KnownLabel:
    """Maps a value to itself if it is known, ``"none"`` if empty (or a sentinel meaning
    none), else ``"other"``.

    ``add`` makes more values known (the names a reload or deploy brings), at most ``room``
    of them over the process's life: the initial set is bounded by the config, and a config
    that keeps renaming its models must not grow the series without limit."""

    def __init__(self, known: Iterable[str], room: int = 64) -> None:
        self.known = frozenset(known)
        self._room = room

    def add(self, names: Iterable[str]) -> None:
        new = [n for n in dict.fromkeys(names) if n and n not in self.known]
        admitted = new[: max(self._room, 0)]
        self._room -= len(admitted)
        self.known = self.known | frozenset(admitted)

    def __call__(self, value: str | None) -> str:
        if not value:
            return NONE
        if value in self.known:
            return value
        return NONE if value in _NONE_SENTINELS else OTHER


class FirstComeLabel:
    """Accepts the preset values plus up to ``extra`` more, first come; the rest is "other"."""

    def __init__(self, preset: Iterable[str] = (), extra: int = 16) -> None:
        self._values = set(preset)
        self._room = extra

    def __call__(self, value: str | None) -> str:
        if not value:
            return NONE
        if value in self._values:
            return value
        if self._room > 0:
            self._room -= 1
            self._values.add(value)
            return value
        return OTHER
