"""The hot-reloadable part of the gateway: price catalog, pool, downstream client and
policies, built from settings as one immutable snapshot. A reload builds a new snapshot and
swaps one reference; in-flight requests finish on the snapshot they started with."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.principal import FIXED_PREFIX
from gateway.settings import Settings
from pricing import ModelPrice, PriceCatalog, load_default_catalog
from router.executors import ProviderExecutor
from router.health import BreakerConfig, CircuitBreakers
from router.loop import Orchestrator
from router.policies.baselines import CascadePolicy, CheapestPolicy, FixedPolicy, RandomPolicy
from router.policy import Policy
from router.pool import ModelPool, PoolModel
from router.providers.balance import DeploymentBalancer
from router.providers.client import CallEvents, DownstreamClient

log = logging.getLogger(__name__)

ROUTER_MODEL = "xrouter"
POLICY_PREFIX = "xrouter/"
# Every policy a runtime may serve; compact and llm only when configured (a checkpoint, a
# router model), the others always.
_KNOWN_POLICIES = frozenset({"cheapest", "random", "cascade", "compact", "llm"})


def build_catalog(settings: Settings) -> PriceCatalog:
    catalog = load_default_catalog()
    if settings.pricing.catalog:
        extra = PriceCatalog.from_yaml(Path(settings.pricing.catalog).read_text(encoding="utf-8"))
        catalog = catalog.with_overrides(
            {n: extra.require(n) for n in extra.names()}, extra.version
        )
    if settings.pricing.overrides:
        catalog = catalog.with_overrides(settings.pricing.overrides)
    return catalog


@dataclass
class Runtime:
    settings: Settings
    catalog: PriceCatalog
    pool: ModelPool
    client: DownstreamClient
    orchestrator: Orchestrator
    policies: dict[str, Policy]
    default_policy: str
    checkpoint_info: dict[str, Any] = field(default_factory=dict)
    # What savings are measured against (``reference_price``), priced as this config prices it.
    reference_price: ModelPrice | None = None
    # When this pool and these policies came to be served: the model list's ``created``,
    # the same on every call (a client caching the list sees no change where there is none).
    created: int = field(default_factory=lambda: int(time.time()))
    _subsets: dict[tuple[str, ...], ModelPool] = field(default_factory=dict, repr=False)

    def subset(self, names: list[str]) -> ModelPool:
        """The pool restricted to ``names``, memoized: requests ask for the same few subsets
        (one per pass-through model, per key allow-list) over and over."""
        key = tuple(names)
        pool = self._subsets.get(key)
        if pool is None:
            pool = self.pool if len(names) == len(self.pool) else self.pool.subset(names)
            if len(self._subsets) < 1024:
                self._subsets[key] = pool
        return pool

    def policy(self, name: str) -> Policy | None:
        if name in self.policies:
            return self.policies[name]
        if name.startswith("fixed:") and name[6:] in self.pool:
            return FixedPolicy(name[6:])
        return None

    @property
    def policy_names(self) -> list[str]:
        return sorted(self.policies)

    def reported_names(self) -> tuple[list[str], list[str]]:
        """The model and policy names this runtime's requests are reported under in metrics:
        its pool ("router": an answer the router gave itself) and its policies (with
        "passthrough": a pool model asked for by name, and ``fixed:<model>`` for each pool
        model: named by the config as surely as the pool is, and what a gateway whose
        default policy is one reports all its traffic under)."""
        fixed = [f"{FIXED_PREFIX}{m}" for m in self.pool.names]
        return [*self.pool.names, "router"], [*self.policy_names, "passthrough", *fixed]

    def take_over(self) -> None:
        """Apply this snapshot's circuit breaker and deployment cooldown settings to the
        breakers and balancer it shares with the snapshot it replaces; called as it is
        swapped in."""
        cb = self.settings.router.circuit_breaker
        self.client.breakers.config = BreakerConfig(cb.failures, cb.cooldown_s)
        self.client.breakers.forget(self.pool.names)
        self.client.balancer.cooldown_s = self.settings.router.deployment_cooldown_s


def _load_compact(settings: Settings, pool: ModelPool) -> tuple[Policy | None, dict[str, Any]]:
    """The compact policy from the configured checkpoint, or the packaged demo one.

    A configured checkpoint that is missing or shares no model with the pool is an error (the
    operator asked for it). The packaged default only knows the demo pool: with a pool that
    holds none of its models it is skipped with a warning, and ``xrouter train`` makes one
    that fits. Pool models a checkpoint was not trained on are listed in the info
    (``untrained_models``): it never routes to them, except by exploration."""
    try:
        from router.checkpoint import (
            CheckpointError,
            default_checkpoint_path,
            load_checkpoint,
        )
        from router.policies.checkpointed import policy_for_checkpoint
    except ImportError as exc:  # the compact policy's assets are optional in a slim install
        log.warning("compact policy unavailable: %s", exc)
        return None, {}
    explicit = settings.router.checkpoint is not None
    path = settings.router.checkpoint or default_checkpoint_path()
    r = settings.router
    try:
        # The policy checks the checkpoint's pool against ours (and warns on price changes).
        policy = policy_for_checkpoint(
            load_checkpoint(path),
            pool,
            epsilon=r.epsilon,
            temperature=r.temperature,
            sample=r.sample,
        )
    except CheckpointError as exc:
        if explicit:
            raise
        log.warning("packaged compact checkpoint not used: %s", exc)
        return None, {}
    ckpt = policy.checkpoint
    return policy, {
        "path": str(path),
        "version": ckpt.version,
        "kind": ckpt.architecture.kind,
        "feature_version": ckpt.feature_version,
        "untrained_models": list(policy.pool_check.untrained),
        "masked_models": list(policy.pool_check.masked),
    }


def _router_model(settings: Settings) -> PoolModel | None:
    cfg = settings.router.llm
    if not cfg.base_url:
        return None
    return PoolModel(
        name="xrouter-router",
        provider="openai",
        upstream_model=cfg.model,
        api_base=cfg.base_url.rstrip("/"),
        api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
        transport="native",
        price=cfg.price if isinstance(cfg.price, ModelPrice) else ModelPrice.free(),
        max_output_tokens=cfg.max_output_tokens,
        timeout_s=cfg.timeout_s,
        max_concurrency=1024,
        max_retries=cfg.max_retries,
        fallbacks=(),
        description="router",
        keep_alive_s=cfg.keep_alive_s,
    )


def reference_price(
    settings: Settings, pool: ModelPool, catalog: PriceCatalog
) -> ModelPrice | None:
    """The price savings are measured against (``metrics.reference_model``): the pool's
    entry for it — its configured ``price:`` — else the catalog's. A name with neither is
    refused (a ValueError), not reported as no savings at all."""
    name = settings.metrics.reference_model
    if not name:
        return None
    if name in pool:
        return pool[name].price
    price = catalog.get(name)
    if price is None:
        raise ValueError(
            f"metrics.reference_model {name!r} has no price: name a pool model or one in "
            "the price catalog (GET /admin/pricing lists them)"
        )
    return price


def build_runtime(
    settings: Settings,
    *,
    events: CallEvents | None = None,
    previous: Runtime | None = None,
) -> Runtime:
    """Build a snapshot; raises (CatalogError, CheckpointPoolMismatch, ...) with a clear
    message when the config is unusable, so a bad reload leaves the old snapshot serving."""
    catalog = build_catalog(settings)
    pool = ModelPool.from_configs(settings.pool, catalog)
    if not len(pool):
        raise ValueError("the pool is empty: configure at least one model under `pool:`")
    unknown = [m for m in settings.router.cascade_order if m not in pool]
    if unknown:
        # Left out of the order, as documented (a reload may take a model out of the pool),
        # but said: a typo here silently put the cascade back in price order.
        log.warning(
            "router.cascade_order names %s, not in the pool (%s): left out of the cascade order",
            ", ".join(unknown),
            ", ".join(pool.names),
        )
    if any(t.transport == "litellm" for m in pool for t in m.targets):
        from router.providers.litellm_provider import preload_litellm

        preload_litellm()
    if previous:
        # Circuits survive a reload: a model that was failing a moment ago still is. The
        # breakers and balancer are the serving snapshot's own: this one's settings go into
        # them when it is swapped in (``take_over``), since a build that fails after this
        # point (a checkpoint that does not load) must leave them as they were.
        client = previous.client.with_pool(pool)
    else:
        breaker = BreakerConfig(
            settings.router.circuit_breaker.failures, settings.router.circuit_breaker.cooldown_s
        )
        on_change = events.on_circuit if events is not None else None
        client = DownstreamClient(
            pool,
            events=events,
            breakers=CircuitBreakers(breaker, on_change=on_change),
            balancer=DeploymentBalancer(settings.router.deployment_cooldown_s),
        )
    orchestrator = Orchestrator(ProviderExecutor(client))
    policies: dict[str, Policy] = {
        "cheapest": CheapestPolicy(),
        "random": RandomPolicy(),
        "cascade": CascadePolicy(settings.router.cascade_order, settings.router.cascade_check),
    }
    info: dict[str, Any] = {}
    compact, info = _load_compact(settings, pool)
    if compact is not None:
        policies["compact"] = compact
    router_model = _router_model(settings)
    if router_model is not None:
        from router.policies.llm import LLMRouterPolicy

        policies["llm"] = LLMRouterPolicy(
            client.provider("native"),
            router_model,
            temperature=settings.router.llm.temperature,
            system_prompt=settings.router.llm.system_prompt,
            cost_weight_in_prompt=settings.router.llm.cost_weight_in_prompt,
        )
    reference = reference_price(settings, pool, catalog)  # a name with no price: refused
    default = settings.router.default_policy
    fixed = default.startswith("fixed:") and default[6:] in pool
    if default not in policies and not fixed:
        if default not in _KNOWN_POLICIES:
            # A name no configuration could serve (a typo, fixed: with a model not in the
            # pool): the config is wrong, and serving another policy would hide it.
            raise ValueError(
                f"router.default_policy {default!r} is no policy: choose from "
                f"{', '.join(sorted(_KNOWN_POLICIES))} or fixed:<pool model>"
            )
        # Not an error: `llm` without a router server configured yet, say, still serves.
        log.warning("default policy %r is not available; using 'cascade'", default)
        default = "cascade"
    log.info(
        "runtime built: %d models, policies %s, default %s",
        len(pool),
        ",".join(sorted(policies)),
        default,
    )
    return Runtime(
        settings, catalog, pool, client, orchestrator, policies, default, info, reference
    )
