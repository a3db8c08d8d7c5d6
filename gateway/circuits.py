"""Circuit openings and closings shared between workers and replicas through Redis.

Each process keeps its own circuit breakers (``router.health``); this tells the others when
one opens or closes. An opening is written as ``SET <prefix>:circuit:<model> <unix ms> PX
<cooldown>`` (the prefix is ``limits.key_prefix``): the key expires when the cooldown does.
A closing (a probe, or any call, answered) overwrites it with ``closed:<unix ms>``, kept for
the cooldown (at least ten sync intervals). Every process reads the pool's keys with one
``MGET`` each ``sync_interval_s``, adopting the openings it has not seen (with the opener's
timing) and closing its circuits that opened before a closing it reads. So a dead model
costs ``failures`` failed calls across the whole deployment plus at most
``sync_interval_s`` of other workers' traffic, not ``failures`` calls per worker; each
process probes for itself when its cooldown ends, and once one probe succeeds the others
close within ``sync_interval_s`` rather than holding the model to one probe at a time (and
reporting it half-open) until their own next call to it. The key of an opening expires
with its cooldown, before any probe: its disappearance cannot say that the model recovered,
so the closing is written rather than the key deleted. (A process of an older version
ignores a ``closed:`` value, and its own closings, which delete the key, are not shared.)

Nothing here is on the request path: publishing is a write-behind command, reading is a
background task, and a Redis that is down only means each process learns on its own again
(logged once per outage).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from gateway.limits.resp import RespClient
from router.health import CircuitBreakers

log = logging.getLogger(__name__)

PREFIX = "xrouter:circuit:"
CLOSED = "closed:"  # a closing's value: CLOSED + unix ms


class SharedCircuits:
    def __init__(
        self,
        client: RespClient,
        breakers: Callable[[], CircuitBreakers],
        models: Callable[[], Sequence[str]],
        *,
        interval_s: float = 1.0,
        prefix: str = PREFIX,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._client = client
        self._breakers = breakers
        self._models = models
        self._interval_s = interval_s
        self._prefix = prefix
        self._adopting: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def on_change(self, model: str, state: str) -> None:
        """The breakers' change hook (from the event loop): publish this process's own
        openings and closings, not the ones it adopted from others."""
        if model in self._adopting:
            return
        cooldown_ms = max(1, int(self._breakers().config.cooldown_s * 1000))
        key = self._prefix + model
        now_ms = int(time.time() * 1000)
        if state == "open":
            command: tuple[str | int, ...] = ("SET", key, str(now_ms), "PX", cooldown_ms)
        elif state == "closed":
            keep_ms = max(cooldown_ms, int(self._interval_s * 10_000))
            command = ("SET", key, f"{CLOSED}{now_ms}", "PX", keep_ms)
        else:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: a process shutting down
            asyncio.get_running_loop().create_task(self._send(command))

    async def _send(self, command: tuple[str | int, ...]) -> None:
        try:
            await self._client.execute(*command)
            self._recovered()
        except Exception as exc:  # Redis down: each process still learns on its own
            self._failed(exc)

    async def sync(self) -> int:
        """Adopt the openings and closings other processes published; returns how many
        circuits that changed here."""
        models = list(self._models())
        if not models:
            return 0
        values = await self._client.execute("MGET", *(self._prefix + m for m in models))
        now_ms = time.time() * 1000
        breakers = self._breakers()
        changed = 0
        for model, value in zip(models, values or (), strict=False):
            if value is None:
                continue
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            closing = text.startswith(CLOSED)
            try:
                at_ms = float(text.removeprefix(CLOSED))
            except ValueError:
                continue
            ago_s = max(0.0, now_ms - at_ms) / 1000
            self._adopting.add(model)
            try:
                if closing:
                    changed += breakers.adopt_closed(model, ago_s)
                else:
                    changed += breakers.adopt_open(model, ago_s)
            finally:
                self._adopting.discard(model)
        return changed

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.sync()
                self._recovered()
            except Exception as exc:
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            log.warning("cannot share circuit breaker state through Redis: %s", exc)

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.info("sharing circuit breaker state through Redis again")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()
