"""Circuit openings shared between workers and replicas through Redis.

Each process keeps its own circuit breakers (``router.health``); this tells the others when
one opens. An opening is written as ``SET <prefix>:circuit:<model> <unix ms> PX <cooldown>``
(the prefix is ``limits.key_prefix``): the key expires when the cooldown does. Every
process reads the pool's keys with one ``MGET`` each ``sync_interval_s``, adopting the
openings it has not seen (with the opener's timing). A successful probe deletes the key; the other processes probe for themselves when
their cooldown ends. So a dead model costs ``failures`` failed calls across the whole
deployment plus at most ``sync_interval_s`` of other workers' traffic, not ``failures``
calls per worker.

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
        if state == "open":
            now_ms = str(int(time.time() * 1000))
            command: tuple[str | int, ...] = ("SET", key, now_ms, "PX", cooldown_ms)
        elif state == "closed":
            command = ("DEL", key)
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
        """Adopt the openings other processes published; returns how many were adopted."""
        models = list(self._models())
        if not models:
            return 0
        values = await self._client.execute("MGET", *(self._prefix + m for m in models))
        now_ms = time.time() * 1000
        breakers = self._breakers()
        adopted = 0
        for model, value in zip(models, values or (), strict=False):
            if value is None:
                continue
            try:
                opened_ms = float(value)
            except (TypeError, ValueError):
                continue
            self._adopting.add(model)
            try:
                adopted += breakers.adopt_open(model, max(0.0, now_ms - opened_ms) / 1000)
            finally:
                self._adopting.discard(model)
        return adopted

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
