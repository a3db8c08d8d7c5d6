"""Turning ``--policy`` specs into fitted offline routers.

Built-in baseline names: ``single:<model>``, ``oracle``, ``random``, ``knn``, ``mf``,
``cascade``; the learned ones take ``name:key=value,...`` hyper-parameters
(``knn:k=100``, ``mf:dim=16,epochs=200``, ``cascade:max_cheap=3,quorums=2|3``). Everything
else goes to a loader registered with ``register_router_loader(prefix, fn)``: the compact
policy's checkpoints (``compact:<path>``) and the lead's adapter for ``router.policy.Policy``
objects plug in there. A loader registered with the empty prefix ``""`` is offered every
spec that names an existing path and may decline it by returning None.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.outcomes import OutcomeRecord
from training.evaluation.baselines import (
    KNNRouter,
    MFRouter,
    OracleRouter,
    RandomMixRouter,
    SingleModelRouter,
)
from training.evaluation.cascade import CascadeFamilyRouter
from training.evaluation.escalation import EscalationRouter
from training.evaluation.sweep import OfflineRouter
from training.evaluation.utility import BASELINE_REWARD
from training.reward import RewardConfig

BASELINE_NAMES = ("oracle", "random", "knn", "mf", "cascade")


class RouterSpecError(ValueError):
    """A ``--policy`` spec names no known baseline or loader, or has bad parameters."""


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What a loader may use: the training split (to fit on), the validation split (to tune
    on), the reward configuration baselines rank models by, and a seed."""

    train: Sequence[OutcomeRecord]
    validation: Sequence[OutcomeRecord] = ()
    reward: RewardConfig = BASELINE_REWARD
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)


RouterLoader = Callable[[str, LoadContext], OfflineRouter | None]


def _parse_params(text: str, spec: str) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = item.partition("=")
        if not sep:
            raise RouterSpecError(f"{spec!r}: expected key=value, got {item!r}")
        # "a|b" is a tuple (e.g. cascade:quorums=2|3).
        values = [_scalar(v) for v in raw.split("|")]
        params[key.strip()] = tuple(values) if len(values) > 1 else values[0]
    return params


def _scalar(raw: str) -> Any:
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            continue
    return raw


def _construct(cls: type, spec: str, arg: str, **fixed: Any) -> Any:
    """``cls(**fixed, **params from the spec)``, rejecting parameters it does not take."""
    params = _parse_params(arg, spec)
    allowed = set(inspect.signature(cls).parameters) - {"embed", "config", "name"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise RouterSpecError(
            f"{spec!r}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(allowed))}"
        )
    hints = typing.get_type_hints(cls.__init__)  # type: ignore[misc]
    params = {k: _typed(v, hints.get(k), spec, k) for k, v in params.items()}
    try:
        return cls(**{**fixed, **params})
    except (TypeError, ValueError) as exc:
        raise RouterSpecError(f"{spec!r}: {exc}") from None


_BOOLS = {"true": True, "false": False, 1: True, 0: False}


def _typed(value: Any, hint: Any, spec: str, key: str) -> Any:
    """``value`` as the parameter's annotation takes it, or a RouterSpecError naming the
    parameter: a text where a number goes failed deep inside fitting (a TypeError's
    traceback, or a comparison's message), and ``combine_final=false`` was truthy."""
    kinds = set(typing.get_args(hint)) - {type(None)} if typing.get_args(hint) else {hint}
    origins = {typing.get_origin(k) or k for k in kinds}
    items = value if isinstance(value, tuple) else (value,)
    if bool in kinds:
        flag = _BOOLS.get(value.lower() if isinstance(value, str) else value)
        if flag is None:
            raise RouterSpecError(f"{spec!r}: {key} takes true or false, got {value!r}")
        return flag
    if int in kinds or any(typing.get_args(k) == (int,) for k in kinds):
        if not all(isinstance(v, int) for v in items):
            raise RouterSpecError(f"{spec!r}: {key} takes an integer, got {value!r}")
        return value
    if float in kinds:
        if isinstance(value, tuple) or not isinstance(value, int | float):
            raise RouterSpecError(f"{spec!r}: {key} takes a number, got {value!r}")
        return float(value)
    if str in kinds:
        return "|".join(str(v) for v in items)  # a name: "7" stays a name
    if origins & {Mapping, dict}:
        raise RouterSpecError(f"{spec!r}: {key} cannot be given in a --policy spec")
    return value


def check_table_model(spec: str, model: str, ctx: LoadContext) -> None:
    """Refuse a spec naming a model the table has no outcome for: a router told to always
    pick it would be scored as whatever stands in for it (e.g. the cheapest model)."""
    known = {m for r in (*ctx.train, *ctx.validation) for m in r.outcomes}
    if known and model not in known:
        raise RouterSpecError(
            f"{spec!r}: the table has no model {model!r} (its models: {', '.join(sorted(known))})"
        )


def build_baseline(spec: str, ctx: LoadContext) -> OfflineRouter | None:
    """A fitted baseline for ``spec``, or None if the spec is not a baseline name."""
    name, _, arg = spec.partition(":")
    router: Any
    if name == "single":
        if not arg:
            raise RouterSpecError("single:<model> needs a model name")
        check_table_model(spec, arg, ctx)
        return SingleModelRouter(arg)
    if name == "oracle":
        return OracleRouter(ctx.reward)
    if name == "random":
        router = _construct(RandomMixRouter, spec, arg, seed=ctx.seed, name=spec)
    elif name == "knn":
        router = _construct(KNNRouter, spec, arg, config=ctx.reward, name=spec)
    elif name == "mf":
        router = _construct(MFRouter, spec, arg, seed=ctx.seed, config=ctx.reward, name=spec)
    elif name == "cascade":
        router = _construct(CascadeFamilyRouter, spec, arg, config=ctx.reward, name=spec)
    elif name == "escalation":
        # Not a default baseline: it needs recorded responses and fits per task (seconds).
        router = _construct(EscalationRouter, spec, arg, config=ctx.reward, name=spec)
    else:
        return None
    fitted: OfflineRouter = router.fit(ctx.train)
    return fitted


class RouterRegistry:
    def __init__(self) -> None:
        self._loaders: dict[str, RouterLoader] = {}

    def register(self, prefix: str, loader: RouterLoader) -> None:
        """Route specs starting with ``prefix`` (e.g. ``"compact:"``) to ``loader``; the
        latest registration for a prefix wins."""
        self._loaders[prefix] = loader

    @property
    def prefixes(self) -> list[str]:
        return sorted(self._loaders)

    def load(self, spec: str, ctx: LoadContext) -> OfflineRouter:
        router = build_baseline(spec, ctx)
        if router is not None:
            return router
        for prefix in sorted((p for p in self._loaders if p), key=len, reverse=True):
            if spec.startswith(prefix):
                loaded = self._loaders[prefix](spec, ctx)
                if loaded is None:
                    raise RouterSpecError(f"loader for {prefix!r} could not load {spec!r}")
                return loaded
        if "" in self._loaders:  # the fallback loader: paths and bare names
            try:
                loaded = self._loaders[""](spec, ctx)
            except ValueError as exc:
                raise RouterSpecError(str(exc)) from None
            if loaded is not None:
                return loaded
        known = ["single:<model>", *BASELINE_NAMES, *(f"{p}..." for p in self.prefixes if p)]
        if "" in self._loaders:
            known.append("a checkpoint path or packaged:<name>")
        if Path(spec).exists():
            hint = " (no loader accepted this path)"
        elif "/" in spec or spec.endswith((".json", ".safetensors")):
            # Most likely a checkpoint's path with a typo, not a policy's name.
            hint = " (no such checkpoint: nothing is at that path)"
        else:
            hint = ""
        raise RouterSpecError(f"unknown policy {spec!r}{hint}; known: {', '.join(known)}")


@functools.cache
def default_registry() -> RouterRegistry:
    """The process-wide registry, created on first use (not at import), with the loaders
    that run real policies through the orchestration loop (compact:, policy:, llm:)."""
    from training.evaluation.loop_router import loop_loaders

    registry = RouterRegistry()
    for prefix, loader in loop_loaders().items():
        registry.register(prefix, loader)
    return registry


def register_router_loader(prefix: str, fn: RouterLoader) -> None:
    """Let ``xrouter eval --policy <prefix>...`` load routers with ``fn(spec, ctx)``."""
    default_registry().register(prefix, fn)
