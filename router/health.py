"""Per-model circuit breakers: stop sending traffic to a model whose calls keep failing.

Without one, every request routed to a dead upstream pays its timeout and retries before
the fallback answers, and a routing policy keeps choosing the model its checkpoint likes.
A model's circuit is

- **closed**: calls go through; each failed attempt of a kind that says the upstream is in
  trouble (timeout, 5xx, connection, 429) counts, a success resets the count;
- **open** after ``failures`` consecutive such failures: calls to it fail at once (kind
  ``circuit_open``, so the client goes to the fallbacks), and routing leaves it out of the
  pool a policy chooses from;
- **half-open** once ``cooldown_s`` has passed: one call is let through as a probe (another
  is let through if a probe reports nothing within ``cooldown_s``, e.g. it was cancelled);
  its success closes the circuit, its failure opens it for another ``cooldown_s``. A probe
  answered with a client error (a 4xx, model not found, a bad body) closes it too: the
  upstream is up and answering, and the error was the request's.

Client errors (4xx, model not found, a bad response body) say nothing about the upstream's
health and don't count. State lives in the process and survives config reloads (keyed by
model name); with a shared store, workers and replicas tell each other when a circuit opens
(``adopt_open``; the gateway shares them through Redis, ``gateway/circuits.py``), as
LiteLLM's router shares cooldowns through its Redis cache, so a dead model costs
``failures`` calls in all, not per worker. Each process still probes for itself, and
closings are shared too (``adopt_closed``): a circuit that opened before another process saw
the model answer again closes.

What a change hook is told (``on_change(model, change)``): ``open`` (an opening, a failed
probe's reopening, an adopted opening), ``probing`` (half-open with the probe out: the
other calls are still kept away), ``half_open`` (the cooldown, or an unanswered probe's,
has run out with no probe out: the next call goes through) and ``closed``. ``half_open`` is
reported when the cooldown ends, from a timer on the running event loop (``refresh``), not
when the next call happens to look: a model that gets no more traffic is not reported
open for ever. So "calls are kept away" (``keeps_away``: open, or probing) is exactly
``open`` or ``probing`` as last reported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from router.providers.errors import UPSTREAM_TROUBLE

log = logging.getLogger(__name__)

State = Literal["closed", "open", "half_open"]
# What the change hook is told: a state, or "probing" (half-open with its probe out).
Change = Literal["closed", "open", "half_open", "probing"]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failures: int = 5  # consecutive failed attempts that open a circuit; 0 turns breaking off
    cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.failures < 0 or self.cooldown_s <= 0:
            raise ValueError("failures must be >= 0 and cooldown_s > 0")

    @property
    def enabled(self) -> bool:
        return self.failures > 0


@dataclass(slots=True)
class _Circuit:
    failures: int = 0
    opened_at: float | None = None  # None: closed
    probe_at: float | None = None  # when the half-open probe was let through
    shown: Change = "closed"  # what the change hook was last told
    timer: asyncio.TimerHandle | None = None  # reports the end of the cooldown (or probe's)


class CircuitBreakers:
    """The circuits of every model, by name. Not thread-safe: used from one event loop."""

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, Change], None] | None = None,
    ) -> None:
        self.config = config or BreakerConfig()
        self._clock = clock
        self._on_change = on_change
        self._circuits: dict[str, _Circuit] = {}

    def state(self, model: str) -> State:
        c = self._circuits.get(model)
        # Turned off (a reload set failures: 0): circuits opened before are closed now, as
        # `allow` already lets their calls through; policies must offer the models again.
        if c is None or c.opened_at is None or not self.config.enabled:
            return "closed"
        return "half_open" if self._clock() - c.opened_at >= self.config.cooldown_s else "open"

    def keeps_away(self, model: str) -> bool:
        """Whether calls to ``model`` are being kept away now: its circuit is open, or
        half-open with its probe out (and not yet presumed lost). A half-open circuit with no
        probe out does not: the next call goes through."""
        c = self._circuits.get(model)
        if c is None or c.opened_at is None or not self.config.enabled:
            return False
        return self._deadline(c) is not None

    def _deadline(self, c: _Circuit) -> float | None:
        """When an open or probing circuit stops keeping calls away (None: it does not)."""
        if c.opened_at is None:
            return None
        now, cooldown = self._clock(), self.config.cooldown_s
        if now - c.opened_at < cooldown:
            return c.opened_at + cooldown
        if c.probe_at is not None and now - c.probe_at < cooldown:
            return c.probe_at + cooldown
        return None

    def available(self, models: Iterable[str]) -> list[str]:
        """The models a policy may choose from: those whose circuit is not open (half-open
        ones included, so that some request probes them)."""
        return [m for m in models if self.state(m) != "open"]

    def allow(self, model: str) -> bool:
        """Whether a call to ``model`` may go out now. In half-open state this admits the
        probe (and records it), so call it right before the call."""
        if not self.config.enabled:
            return True
        state = self.state(model)
        if state == "closed":
            return True
        if state == "open":
            return False
        c = self._circuits[model]
        now = self._clock()
        if c.probe_at is not None and now - c.probe_at < self.config.cooldown_s:
            return False  # a probe is in flight
        c.probe_at = now
        self._notify(model, "probing")
        return True

    def record_success(self, model: str) -> None:
        c = self._circuits.get(model)
        if c is None:
            return
        if c.opened_at is not None:
            log.info("circuit for %s closed: a call succeeded", model)
        self._close(model)

    def _probing(self, model: str) -> bool:
        """Whether ``model``'s circuit is half-open with its probe out."""
        c = self._circuits.get(model)
        return c is not None and c.probe_at is not None and self.state(model) == "half_open"

    def _close(self, model: str) -> None:
        c = self._circuits[model]
        was_open = c.opened_at is not None
        c.failures, c.opened_at, c.probe_at = 0, None, None
        if c.timer is not None:
            c.timer.cancel()
            c.timer = None
        if was_open:
            self._notify(model, "closed")

    def record_failure(self, model: str, kind: str) -> None:
        if not self.config.enabled:
            return
        if kind not in UPSTREAM_TROUBLE:
            # Not the upstream's trouble; but when it answers the half-open probe it is the
            # probe's answer. Ignored, it would hold the probe slot and keep the model out
            # for another full cooldown although the upstream is plainly up.
            if kind != "circuit_open" and self._probing(model):
                log.info("circuit for %s closed: its probe was answered (%s)", model, kind)
                self._close(model)
            return
        c = self._circuits.setdefault(model, _Circuit())
        c.failures += 1
        if c.opened_at is not None:
            # A failed probe (or a call that was already out when the circuit opened):
            # open again for a full cooldown (and tell the other workers again).
            c.opened_at, c.probe_at = self._clock(), None
            self._notify(model, "open")
        elif c.failures >= self.config.failures:
            c.opened_at = self._clock()
            log.warning(
                "circuit for %s opened after %d consecutive failures (%s); retrying in %.0f s",
                model,
                c.failures,
                kind,
                self.config.cooldown_s,
            )
            self._notify(model, "open")

    def refresh(self, models: Iterable[str] | None = None) -> None:
        """Report the circuits (of ``models``; default all) whose cooldown, or unanswered
        probe's, has run out since they were reported open or probing: ``half_open``. Runs
        from a timer at that moment; callable at any time (it only reports changes)."""
        for model in list(self._circuits if models is None else models):
            c = self._circuits.get(model)
            if c is None or c.opened_at is None:
                continue
            # One reading of the clock decides: read twice, a deadline passing between the
            # reads left the circuit neither re-armed nor reported, "open" for good.
            deadline = self._deadline(c)
            if deadline is not None:
                self._arm(model, c, deadline)  # the timer fired a hair early: look again then
            elif c.shown != "half_open":
                self._notify(model, "half_open")

    def _arm(self, model: str, c: _Circuit, deadline: float | None) -> None:
        """Have ``refresh`` look at ``model`` at ``deadline``, when it stops keeping calls
        away (at once if that has passed: a report of "open" or "probing" is always
        followed by a look). Without a running event loop (the breakers driven by hand),
        ``refresh`` is the caller's."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if c.timer is not None:
            c.timer.cancel()
        # A timer of the loop's clock; the breaker's is time.monotonic, as the loop's. The
        # loop's timers may fire a little early (uvloop's clock is cached, in ms): refresh
        # then arms again for what is left.
        delay = 0.0 if deadline is None else max(0.0, deadline - self._clock())
        c.timer = loop.call_later(delay, self.refresh, [model])

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the circuits of models not in ``keep`` (the pool a reload left): a model no
        longer served is no longer open, so neither its metric nor ``/admin/router`` (nor
        an alert on them) goes on saying it is. An open one is reported closed."""
        kept = set(keep)
        for model in [m for m in self._circuits if m not in kept]:
            if self._circuits[model].opened_at is not None:
                self._close(model)
            del self._circuits[model]

    def adopt_open(self, model: str, opened_ago_s: float) -> bool:
        """Open ``model``'s circuit because another process saw it fail, ``opened_ago_s``
        seconds ago, so that the cooldown ends when theirs does. Only a closed circuit is
        changed (one this process opened or already adopted keeps its own timing); a
        report older than the cooldown is ignored. Returns whether the circuit opened."""
        if not self.config.enabled or opened_ago_s >= self.config.cooldown_s:
            return False
        if self.state(model) != "closed":
            return False
        c = self._circuits.setdefault(model, _Circuit())
        c.failures = self.config.failures
        c.opened_at, c.probe_at = self._clock() - max(0.0, opened_ago_s), None
        log.warning("circuit for %s opened: another worker saw it failing", model)
        self._notify(model, "open")
        return True

    def adopt_closed(self, model: str, closed_ago_s: float) -> bool:
        """Close ``model``'s circuit because another process saw the model answer (its
        probe, or any call) ``closed_ago_s`` seconds ago, if this circuit opened before that
        (an opening of its own or an adopted one: either way older news). A circuit that
        opened since, here or by adoption, stays open. Returns whether it closed."""
        c = self._circuits.get(model)
        if c is None or c.opened_at is None:
            return False
        if self._clock() - c.opened_at <= max(0.0, closed_ago_s):
            return False
        log.info("circuit for %s closed: another worker saw it answer", model)
        self._close(model)
        return True

    def open_models(self) -> list[str]:
        return sorted(m for m in self._circuits if self.state(m) != "closed")

    def _notify(self, model: str, change: Change) -> None:
        c = self._circuits.get(model)
        if c is not None:
            c.shown = change
            if change in ("open", "probing"):
                self._arm(model, c, self._deadline(c))
        if self._on_change is not None:
            self._on_change(model, change)
