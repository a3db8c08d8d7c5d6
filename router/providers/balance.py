"""Choosing among a pool model's deployments.

The router decides *which model* answers; when that model is served in several places (vLLM
replicas, two provider accounts), this decides *where*. The rule is LiteLLM's "least busy"
with a cooldown:

* the deployment with the fewest calls in flight relative to its ``max_concurrency`` goes
  first; ties rotate, so an idle pool spreads its calls evenly;
* a deployment whose call failed in a way another deployment might not (a timeout, a reset
  connection, a 429 or a 5xx; a 401, 403 or 404 of its own account) cools down for
  ``cooldown_s`` (or as long as its ``retry-after`` asked, if longer): it is passed over
  while any other is available, and tried again once the time is up;
* within one call, each retry goes to a deployment not tried yet while there is one, and
  never to one the call gave up on (``skip``: it refused the gateway, or asked for a longer
  wait than the call retries after).

A model with one deployment never reaches this code's bookkeeping. State is per process (a
deployment's calls in flight are this worker's); cooldowns are short, so each worker finds a
failing deployment out on its own within a call or two.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from router.pool import PoolModel

DEFAULT_COOLDOWN_S = 5.0


@dataclass(slots=True)
class _State:
    in_flight: int = 0
    cool_until: float = 0.0


class DeploymentBalancer:
    def __init__(
        self,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._state: dict[tuple[str, str | None], _State] = {}
        self._turn: dict[str, itertools.count[int]] = {}

    def _of(self, target: PoolModel) -> _State:
        key = (target.name, target.deployment)
        state = self._state.get(key)
        if state is None:
            state = self._state[key] = _State()
        return state

    def pick(
        self,
        model: PoolModel,
        tried: Collection[str | None] = (),
        skip: Collection[str | None] = (),
    ) -> PoolModel:
        """Where the next call to ``model`` goes (``tried``: deployments this call already
        failed on; ``skip``: those of them it must not call again, unless that is all)."""
        targets = model.targets
        if len(targets) == 1:
            return targets[0]
        usable = [t for t in targets if t.deployment not in skip] or list(targets)
        fresh = [t for t in usable if t.deployment not in tried] or usable
        now = self._clock()
        ready = [t for t in fresh if self._of(t).cool_until <= now]
        if not ready:
            # Every candidate is cooling down: the one whose cooldown ends first.
            return min(fresh, key=lambda t: self._of(t).cool_until)
        turn = next(self._turn.setdefault(model.name, itertools.count()))
        n = len(ready)

        def load(i: int) -> tuple[float, int]:
            t = ready[i]
            # Rotating the tie-break spreads an idle pool's calls evenly.
            return (self._of(t).in_flight / t.max_concurrency, (i - turn) % n)

        return ready[min(range(n), key=load)]

    def started(self, target: PoolModel) -> None:
        if target.deployment is not None:
            self._of(target).in_flight += 1

    def finished(self, target: PoolModel) -> None:
        if target.deployment is not None:
            self._of(target).in_flight -= 1

    def failed(self, target: PoolModel, wait_s: float | None = None) -> None:
        """A failure another deployment might not share: cool this one down, for at least
        ``wait_s`` when given (the upstream's ``retry-after``)."""
        if target.deployment is not None:
            cooldown = max(self.cooldown_s, wait_s or 0.0)
            self._of(target).cool_until = self._clock() + cooldown

    def succeeded(self, target: PoolModel) -> None:
        if target.deployment is not None:
            self._of(target).cool_until = 0.0

    def cooling(self) -> dict[str, list[str]]:
        """Each model's deployments cooling down now (for the operators' view)."""
        now = self._clock()
        out: dict[str, list[str]] = {}
        for (model, deployment), state in self._state.items():
            if deployment is not None and state.cool_until > now:
                out.setdefault(model, []).append(deployment)
        return out
