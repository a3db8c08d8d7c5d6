"""Prometheus metrics for the gateway.

``GatewayMetrics`` owns every metric, registered in a registry the caller passes in (never
the process-global default, so tests and several apps in one process don't collide). All
names start with ``xrouter_`` and use base units: seconds, USD, tokens.

Label values are bounded (``gateway.metric_labels``): a model or policy the config does not
name is ``"other"``, none is ``"none"``, and free-form vocabularies keep a few values.

Multiprocess (rendering and aggregation: ``gateway.metrics_render``). Gauges declare how
several workers' values combine:
``livesum`` for the queue depth (the depth of all live queues), ``livemax`` for open circuits
(a worker that died with a circuit open must not hold it open on the dashboard forever),
``mostrecent`` for budget remaining (``gateway.key_budget_metrics``), ``max`` for build info, ``liveall`` (one series per live worker) for the serving
router checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from gateway.key_budget_metrics import KeyBudgetSeries
from gateway.metric_labels import OTHER, FirstComeLabel, KnownLabel, status_class
from pricing.money import MICROS_PER_USD

# LLM calls take from a few milliseconds (a cached or tiny answer) to minutes (long
# reasoning or generation), so the buckets span 5 ms .. 10 min, denser where most calls are.
LLM_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
# The gateway's own overhead (auth, limits, routing, serialization) is sub-millisecond to a
# few milliseconds; with the LLM buckets every observation would land in the first bucket.
OVERHEAD_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip

# Downstream calls per request: 0 (answered by the router, or refused), 1, and a cascade's
# rounds (plans call at most five models; the llm router up to its max_turns).
CALL_COUNT_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 5, 8, 16)
# Feedback scores are in [0, 1], and so is the logged reward with the default K = 1 (a
# larger K lands above 1 in +Inf).
SCORE_BUCKETS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

TOKEN_KINDS = ("prompt", "completion", "cached", "reasoning")
# Rate-limit refusals: the key's requests or tokens a minute, or its requests in flight.
RATE_LIMITS = ("rpm", "tpm", "parallel")
# Budget rejections: the key's budget, or the request's own cap (max_cost_usd).
BUDGET_REASONS = ("key", "request")
# Why key budgets were restored from the ledger (gateway.budget_sync).
RESTORE_TRIGGERS = ("startup", "store_lost", "key_update")
# The ledger writer's vocabularies (gateway.ledger.writer), and the limit store's modes.
SPILL_REASONS = ("queue_full", "db_error", "db_unavailable")
WRITE_ERROR_KINDS = ("db", "data", "spill", "closed")
STORE_ERROR_MODES = ("open", "closed")


def _usd(micros: int) -> float:
    return micros / MICROS_PER_USD


_APIS = frozenset({"chat", "responses", "messages"})


class GatewayMetrics:
    """Every gateway metric, with methods that take plain values (no prometheus types leak
    into callers). Also the ledger writer's metrics sink: ``queue_depth``, ``spilled``,
    ``write_error``, ``flushed``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        models: Iterable[str],
        policies: Iterable[str],
        budget_gauge_keys: int = 20,
        version: str = "unknown",
    ) -> None:
        self.registry = registry
        self._model = KnownLabel(models)
        self._policy = KnownLabel(policies)
        # Deployment names come from the config (bounded by it); the room caps a config
        # that keeps changing them across reloads.
        self._deployment = FirstComeLabel(extra=64)
        # Presets: the vocabularies of router.providers.errors.ErrorKind and the ledger
        # writer's sink; anything new still gets a series, up to the first-come room.
        self._error_kind = FirstComeLabel(
            ("timeout", "rate_limited", "bad_request", "upstream_4xx", "upstream_5xx",
             "connection", "bad_response", "not_found", "budget", "circuit_open")
        )  # fmt: skip
        self._spill_reason = FirstComeLabel(SPILL_REASONS)
        self._write_error_kind = FirstComeLabel(WRITE_ERROR_KINDS)
        self._budget_reason = FirstComeLabel(BUDGET_REASONS, extra=4)
        # labels() validates and locks on every call; the hot path asks for the same few
        # children over and over, so keep them (label values are bounded, so is this).
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

        self._traffic_metrics(registry)
        self._routing_metrics(registry)
        self._limit_metrics(registry)
        self._load_metrics(registry)
        self._ledger_metrics(registry)
        self._cache_metrics(registry)
        # The one label operators create (key aliases): its own bounded series.
        self.key_budgets = KeyBudgetSeries(registry, limit=budget_gauge_keys)
        self._info_metrics(registry, version)
        self._preset_series()

    def _traffic_metrics(self, r: CollectorRegistry) -> None:
        """Requests, their tokens, cost and savings, and how long they took."""
        # prometheus_client appends "_total" to counter names.
        self._requests = Counter(
            "xrouter_requests",
            "Requests answered, by policy, answering model, status class and the API they came "
            "in (chat, responses, messages).",
            ["policy", "model", "status_class", "api"],
            registry=r,
        )
        self._tokens = Counter(
            "xrouter_tokens",
            "Tokens used by downstream and router calls. cached is part of prompt and "
            "reasoning part of completion: don't sum across kinds.",
            ["model", "kind"],
            registry=r,
        )
        self._cost = Counter(
            "xrouter_cost_usd",
            "Cost of downstream and router calls in USD.",
            ["model", "policy"],
            registry=r,
        )
        # Savings against the reference model can be negative for a request (the router
        # picked something dearer). A counter can't go down, and a gauge named *_total breaks
        # rate(); so two counters: net savings = savings - overspend, and each is rate()-able.
        self._savings = Counter(
            "xrouter_savings_usd",
            "Reference-model cost minus actual cost, summed over requests where it was >= 0.",
            ["policy"],
            registry=r,
        )
        self._overspend = Counter(
            "xrouter_overspend_usd",
            "Actual cost minus reference-model cost, summed over requests that cost more than "
            "the reference. Net savings = xrouter_savings_usd_total - this.",
            ["policy"],
            registry=r,
        )
        self._request_duration = Histogram(
            "xrouter_request_duration_seconds",
            "Wall time of a request in the gateway, end to end.",
            ["policy"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        # How many downstream calls a request made: 1 for single-call policies; a cascade's
        # share above 1 is how often it escalated (or called models in parallel).
        self._calls_per_request = Histogram(
            "xrouter_downstream_calls_per_request",
            "Downstream model calls made for one request.",
            ["policy"],
            buckets=CALL_COUNT_BUCKETS,
            registry=r,
        )
        self._overhead = Histogram(
            "xrouter_overhead_seconds",
            "Request time spent in the gateway itself (total minus upstream and router calls).",
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        # Quality as clients report it (POST /v1/feedback) and the reward the gateway logs
        # with it: what the routers are retrained on, per policy, as it comes in.
        self._feedback_score = Histogram(
            "xrouter_feedback_score",
            "Feedback scores (0-1) given to answered requests, by the policy that answered.",
            ["policy"],
            buckets=SCORE_BUCKETS,
            registry=r,
        )
        self._feedback_reward = Histogram(
            "xrouter_feedback_reward",
            "The logged reward (router.reward: the score net of the cost penalty at the "
            "request's cost weight) of each feedback score, by policy.",
            ["policy"],
            buckets=SCORE_BUCKETS,
            registry=r,
        )

    def _routing_metrics(self, r: CollectorRegistry) -> None:
        """Routing decisions and the downstream calls they made: durations, errors,
        fallbacks, deployments, circuits."""
        self._decisions = Counter(
            "xrouter_routing_decisions",
            "Models chosen by routing policies.",
            ["policy", "model"],
            registry=r,
        )
        # Only calls a model answered: a failed call has no duration of its own (its failed
        # attempts are counted in xrouter_upstream_errors_total) and one a budget refused was
        # never made. So the count is one per successful attempt, and errors / (errors +
        # count) is the share of a model's attempts that failed.
        self._upstream_duration = Histogram(
            "xrouter_upstream_duration_seconds",
            "Duration of one downstream model call that got an answer (a stream cut short "
            "included); failed attempts are counted in xrouter_upstream_errors_total.",
            ["model"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "xrouter_time_to_first_token_seconds",
            "Time to the first streamed token of a downstream call.",
            ["model"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self._upstream_errors = Counter(
            "xrouter_upstream_errors",
            "Failed downstream call attempts (each retry and fallback counts), and calls an "
            "open circuit skipped (kind circuit_open).",
            ["model", "kind"],
            registry=r,
        )
        self._deployment_calls = Counter(
            "xrouter_deployment_calls",
            "Calls to the deployments of models served in several places, by outcome (ok, "
            "error): how the load spreads, and which deployment fails.",
            ["model", "deployment", "outcome"],
            registry=r,
        )
        self._fallbacks = Counter(
            "xrouter_fallbacks",
            "Calls answered by a fallback model, by the model that failed.",
            ["model"],
            registry=r,
        )
        self._router_query_copies = Counter(
            "xrouter_router_query_copies",
            "Times the router copied the user query into a downstream system prompt.",
            registry=r,
        )
        self._circuit_open = Gauge(
            "xrouter_circuit_open",
            "1 while a model's circuit breaker keeps calls away from it: open, or half-open "
            "with its probe out (router.health); 0 once the cooldown has run out with no "
            "probe out, or closed.",
            ["model"],
            registry=r,
            multiprocess_mode="livemax",
        )

    def _load_metrics(self, r: CollectorRegistry) -> None:
        """Model requests in flight, and those shed over ``server.max_in_flight``."""
        self._in_flight = Gauge(
            "xrouter_requests_in_flight",
            "Model requests (chat, Responses, Messages) being answered, streams included.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self._shed = Counter(
            "xrouter_requests_shed",
            "Model requests refused at once because server.max_in_flight were in flight.",
            ["api"],
            registry=r,
        )

    def _limit_metrics(self, r: CollectorRegistry) -> None:
        """Budget and rate-limit refusals, the limit store's failures and budget restores."""
        self._budget_rejections = Counter(
            "xrouter_budget_rejections",
            "Requests refused because a budget would be exceeded.",
            ["reason"],
            registry=r,
        )
        self._rate_limited = Counter(
            "xrouter_rate_limited", "Requests refused by a rate limit.", ["limit"], registry=r
        )
        self._limit_store_errors = Counter(
            "xrouter_limit_store_errors",
            "Limit-store (Redis) failures, by the on_store_error mode that handled them.",
            ["mode"],
            registry=r,
        )
        self._budget_restores = Counter(
            "xrouter_budget_restores",
            "Times key budgets' spend counters were restored from the ledger: at startup, "
            "after the limit store lost them (store_lost: a Redis flushed or restarted without "
            "persistence), or for a key whose budget an operator changed (key_update).",
            ["trigger"],
            registry=r,
        )

    def _ledger_metrics(self, r: CollectorRegistry) -> None:
        """The ledger writer's queue, rows, spills and errors, and retention."""
        self._ledger_queue_depth = Gauge(
            "xrouter_ledger_queue_depth",
            "Rows waiting in the ledger writer's queue.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self._ledger_spilled = Counter(
            "xrouter_ledger_spilled",
            "Ledger rows written to the spill directory instead of the database.",
            ["reason"],
            registry=r,
        )
        self._ledger_write_errors = Counter(
            "xrouter_ledger_write_errors", "Failed ledger writes.", ["kind"], registry=r
        )
        self._ledger_rows = Counter(
            "xrouter_ledger_rows",
            "Records (request and feedback rows) newly written to the ledger database, each "
            "once: a replayed or resubmitted record already there is not counted again.",
            registry=r,
        )
        self._ledger_content_dropped = Counter(
            "xrouter_ledger_content_dropped",
            "Requests whose logged content (prompt and answer) was dropped for being older "
            "than ledger.content_retention_days.",
            registry=r,
        )
        self._ledger_requests_deleted = Counter(
            "xrouter_ledger_requests_deleted",
            "Requests deleted from the ledger (with their calls, feedback and tags) for being "
            "older than ledger.request_retention_days.",
            registry=r,
        )

    def _cache_metrics(self, r: CollectorRegistry) -> None:
        """The answer cache's lookups, stores and savings."""
        self._cache_lookups = Counter(
            "xrouter_cache_lookups",
            "Answer-cache lookups: hit, coalesced (answered with an identical request's "
            "answer, bought while this one waited), miss, bypass (the request said no_cache) "
            "or error (the backend failed or is backed off: served as a miss).",
            ["result"],
            registry=r,
        )
        self._cache_stores = Counter(
            "xrouter_cache_stores",
            "Answers offered to the cache: stored, too_large or error.",
            ["result"],
            registry=r,
        )
        self._cache_saved = Counter(
            "xrouter_cache_saved_usd",
            "What the requests answered from the cache would have cost: the cached answers' "
            "original cost.",
            ["policy"],
            registry=r,
        )

    def _info_metrics(self, r: CollectorRegistry, version: str) -> None:
        """The build and the router checkpoint served."""
        self._build_info = Gauge(
            "xrouter_build_info",
            "Always 1; the version label says which build is running.",
            ["version"],
            registry=r,
            multiprocess_mode="max",
        )
        self._build_info.labels(version=version).set(1)
        # Which router checkpoint each worker serves: after `xrouter deploy`, every worker
        # of every replica should show the new version (a pid label per live worker).
        self._checkpoint = Gauge(
            "xrouter_router_checkpoint_info",
            "1 for the router checkpoint this worker serves (content version and kind), "
            "0 for ones it served before.",
            ["version", "kind"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self._serving_checkpoint: tuple[str, str] | None = None

    def _preset_series(self) -> None:
        # Series that should exist (at 0) from the start, so rate() and alerts see them:
        # increase() needs two samples of a series, so one born at 1 hides its first event
        # (a single loss of the budgets' counters, a single ledger write error would never
        # fire deploy/prometheus/alerts.yml).
        for limit in RATE_LIMITS:
            self._rate_limited.labels(limit=limit)
        for reason in BUDGET_REASONS:
            self._budget_rejections.labels(reason=reason)
        for result in ("hit", "coalesced", "miss", "bypass", "error"):
            self._cache_lookups.labels(result=result)
        for trigger in RESTORE_TRIGGERS:
            self._budget_restores.labels(trigger=trigger)
        for reason in SPILL_REASONS:
            self._ledger_spilled.labels(reason=reason)
        for kind in WRITE_ERROR_KINDS:
            self._ledger_write_errors.labels(kind=kind)
        for mode in STORE_ERROR_MODES:
            self._limit_store_errors.labels(mode=mode)
        for api in sorted(_APIS):
            self._shed.labels(api=api)

    def add_known(self, *, models: Iterable[str], policies: Iterable[str]) -> None:
        """Models and policies a reload or deploy brought: reported by name from now on
        (within a fixed room; names known before stay known, their series exist)."""
        self._model.add(models)
        self._policy.add(policies)

    # -- requests and calls ----------------------------------------------------------------

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def observe_request(
        self,
        policy: str,
        model: str | None,
        status: int | str,
        duration_s: float,
        overhead_s: float | None,
        cost_micros: int,
        reference_cost_micros: int | None = None,
        downstream_calls: int | None = None,
        api: str = "chat",
    ) -> None:
        """One finished request. ``model`` answered it (None if none did);
        ``reference_cost_micros`` is what the reference model would have cost;
        ``downstream_calls`` how many pool-model calls it made; ``api`` the shape it came in."""
        p = self._policy(policy)
        api = api if api in _APIS else OTHER
        self._child(self._requests, p, self._model(model), status_class(status), api).inc()
        self._child(self._request_duration, p).observe(duration_s)
        if downstream_calls is not None:
            self._child(self._calls_per_request, p).observe(downstream_calls)
        if overhead_s is not None:
            self._overhead.observe(overhead_s)
        if reference_cost_micros is not None:
            saved = reference_cost_micros - cost_micros
            if saved >= 0:
                self._child(self._savings, p).inc(_usd(saved))
            else:
                self._child(self._overspend, p).inc(_usd(-saved))

    def observe_call(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        reasoning_tokens: int,
        cost_micros: int,
        duration_s: float | None,
        ttft_s: float | None = None,
        *,
        policy: str | None = None,
    ) -> None:
        """One downstream (or router) model call; ``duration_s`` None for one no model
        answered (it has no duration to observe)."""
        m = self._model(model)
        for kind, n in (
            ("prompt", prompt_tokens),
            ("completion", completion_tokens),
            ("cached", cached_tokens),
            ("reasoning", reasoning_tokens),
        ):
            if n:
                self._child(self._tokens, m, kind).inc(n)
        self._child(self._cost, m, self._policy(policy)).inc(_usd(cost_micros))
        if duration_s is not None:
            self._child(self._upstream_duration, m).observe(duration_s)
        if ttft_s is not None:
            self._child(self._ttft, m).observe(ttft_s)

    def serving_checkpoint(self, version: str | None, kind: str | None) -> None:
        """The checkpoint now serving (None: no checkpoint-served policy). A version is new
        only at a deploy or retraining, so the series stay few."""
        labels = (version, kind or "unknown") if version else None
        if labels == self._serving_checkpoint:
            return
        if self._serving_checkpoint is not None:
            self._checkpoint.labels(*self._serving_checkpoint).set(0)
        if labels is not None:
            self._checkpoint.labels(*labels).set(1)
        self._serving_checkpoint = labels

    def decision(self, policy: str, model: str | None) -> None:
        self._child(self._decisions, self._policy(policy), self._model(model)).inc()

    def upstream_error(self, model: str, kind: str) -> None:
        self._upstream_errors.labels(model=self._model(model), kind=self._error_kind(kind)).inc()

    def circuit(self, model: str, is_open: bool) -> None:
        self._circuit_open.labels(model=self._model(model)).set(1 if is_open else 0)

    def deployment_call(self, model: str, deployment: str, ok: bool) -> None:
        outcome = "ok" if ok else "error"
        self._child(
            self._deployment_calls, self._model(model), self._deployment(deployment), outcome
        ).inc()

    def fallback(self, model: str) -> None:
        self._fallbacks.labels(model=self._model(model)).inc()

    def query_copied(self, n: int = 1) -> None:
        """The router copied the user query into a downstream system prompt ``n`` times."""
        self._router_query_copies.inc(n)

    # -- limits ------------------------------------------------------------------------------

    def budget_rejected(self, reason: str) -> None:
        self._budget_rejections.labels(reason=self._budget_reason(reason)).inc()

    def rate_limited(self, limit: str) -> None:
        self._rate_limited.labels(limit=limit if limit in RATE_LIMITS else OTHER).inc()

    def limit_store_error(self, mode: str) -> None:
        self._limit_store_errors.labels(mode=mode if mode in STORE_ERROR_MODES else OTHER).inc()

    def budget_restored(self, trigger: str) -> None:
        known = RESTORE_TRIGGERS
        self._child(self._budget_restores, trigger if trigger in known else OTHER).inc()

    # -- answer cache ------------------------------------------------------------------------

    def in_flight(self, delta: int) -> None:
        self._in_flight.inc(delta)

    def shed(self, api: str) -> None:
        self._child(self._shed, api if api in _APIS else OTHER).inc()

    def cache_lookup(self, result: str) -> None:
        known = ("hit", "coalesced", "miss", "bypass", "error")
        self._child(self._cache_lookups, result if result in known else OTHER).inc()

    def cache_store(self, result: str) -> None:
        known = ("stored", "too_large", "error")
        self._child(self._cache_stores, result if result in known else OTHER).inc()

    def feedback(self, policy: str, score: float, reward: float) -> None:
        p = self._policy(policy)
        self._child(self._feedback_score, p).observe(score)
        self._child(self._feedback_reward, p).observe(reward)

    def cache_saved(self, policy: str, micros: int) -> None:
        self._child(self._cache_saved, self._policy(policy)).inc(_usd(micros))

    # -- ledger sink -------------------------------------------------------------------------

    def queue_depth(self, n: int) -> None:
        self._ledger_queue_depth.set(n)

    def spilled(self, n: int, reason: str) -> None:
        self._ledger_spilled.labels(reason=self._spill_reason(reason)).inc(n)

    def write_error(self, kind: str) -> None:
        self._ledger_write_errors.labels(kind=self._write_error_kind(kind)).inc()

    def flushed(self, n: int) -> None:
        self._ledger_rows.inc(n)

    def content_dropped(self, n: int) -> None:
        self._ledger_content_dropped.inc(n)

    def requests_deleted(self, n: int) -> None:
        self._ledger_requests_deleted.inc(n)
