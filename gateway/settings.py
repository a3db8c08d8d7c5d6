"""One validated settings object, loaded from YAML plus environment variables.

Precedence: defaults < YAML file < environment. ``${VAR}`` and ``${VAR:-default}`` in the
YAML are expanded from the environment before validation, so secrets never need to be in
the file. Any setting can also be overridden by ``XROUTER_<SECTION>__<KEY>`` (double
underscore between levels), e.g. ``XROUTER_LEDGER__URL=postgresql+asyncpg://...``: the
value of a text setting (a key, a URL, a name) is taken as written, any other's is read as
YAML (``2``, ``true``, ``[a, b]``).
"""

from __future__ import annotations

import os
import re
import types
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import MultiHostUrl, Url

from pricing import ModelPrice
from pricing.catalog import yaml_problem
from router.outcomes import MAX_COST_WEIGHT
from router.pool import DEFAULT_KEEP_ALIVE_S, PoolModelConfig, has_userinfo, strip_secret
from router.reward import RewardConfig
from router.tools import check_tool_names

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
ENV_PREFIX = "XROUTER_"


class SettingsError(ValueError):
    """The configuration is invalid; the message says where and why."""


class _Section(BaseModel):
    # No inf or NaN in any setting: YAML reads `.inf` as a float that `gt=0` lets through,
    # and an infinite timeout overflows where it becomes milliseconds (a Redis call's).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_ORIGIN = re.compile(r"https?://[^/\s*]+")


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # The values serve's --log-level takes, so a level is written the same in both places.
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    # The longest a request may run, streamed answer included: past it the gateway cancels
    # what is in flight and answers 504. Budget holds live this long plus 60 s, so a hold
    # never expires under a call that is still running. At most a week: a hold's TTL in
    # milliseconds must be an integer Redis takes, and 1e20 ("no timeout") was not, which
    # made every request of a key with limits a 503 blaming the limit store.
    request_timeout_s: float = Field(default=600.0, gt=0, le=7 * 86400)
    # How long a client may take to send its whole request body: past it, a 408 and the
    # connection closed. A body trickled in a byte at a time would otherwise hold a worker
    # (and one of its max_in_flight places) for as long as the client likes.
    body_timeout_s: float = Field(default=30.0, gt=0)
    # How long an idle client connection is kept open. uvicorn's default (5 s) equals
    # httpx's (the OpenAI SDK's) idle expiry and is below every load balancer's idle timeout
    # (AWS ALB 60 s), so a client or balancer reusing a connection the gateway is closing at
    # that moment gets a reset instead of an answer; measured here under load as 1 failed
    # request in ~8,000. Keep it above the idle timeout of whatever sits in front.
    keep_alive_s: int = Field(default=75, ge=1)
    # Web pages (origins) that may call the gateway from a browser; ["*"] for any. Off by
    # default (gateway.cors). Read at start, as the rest of `server`.
    cors_allow_origins: list[str] = Field(default_factory=list)
    # Forward a request's W3C trace context (traceparent, tracestate) on its upstream calls
    # to OpenAI-compatible servers (router.providers.trace_context).
    forward_trace_context: bool = True
    # The most model requests (chat, Responses, Messages) one worker holds at once; past
    # it they are refused at once with a retryable 503 (gateway.load_shedding). None: no
    # bound.
    max_in_flight: int | None = Field(default=None, ge=1)

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        # From the environment, one string: XROUTER_SERVER__CORS_ALLOW_ORIGINS='*' or
        # 'https://a.example,https://b.example' (a YAML list works too).
        if isinstance(value, str):
            return [o.strip() for o in value.split(",") if o.strip()]
        return value

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        # An origin is scheme://host[:port]; a browser sends it without a path or a
        # trailing slash, so "https://app.example/" would never match anything.
        for origin in value:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: write scheme://host[:port] (no path, no "
                    "trailing slash), or '*' for any"
                )
        return value


class AuthSettings(_Section):
    enabled: bool = True
    admin_key: SecretStr | None = None

    _strip = field_validator("admin_key")(strip_secret)


class LedgerSettings(_Section):
    url: str = "sqlite+aiosqlite:///./xrouter.db"
    log_content: Literal["none", "hash", "full"] = "none"
    flush_interval_ms: int = Field(default=200, ge=1)
    flush_rows: int = Field(default=500, ge=1)
    queue_size: int = Field(default=10_000, ge=1)
    spill_dir: str = "./xrouter-spill"
    # Every acknowledged request is journaled before its response is sent. Without fsync
    # the journal survives the gateway process being killed (kill -9, OOM); with it, a
    # machine crash or power loss too, at the cost of one fsync per group commit.
    journal_fsync: bool = False
    # Drop logged prompts and answers (log_content: hash/full) of requests older than this
    # many days, keeping the rest of their rows; None keeps them. Checked every
    # retention_interval_s by each worker.
    # At most 100 years (36,500 days), as is request_retention_days: further back than the
    # year 1 is no date (999999, meant as "keep them", failed the retention every interval).
    content_retention_days: float | None = Field(default=None, gt=0, le=36_500)
    # Delete requests older than this many days, with their calls, feedback and tags (the
    # ledger grows ~1 KB a request); None keeps them. At least 32: the budgets of the
    # current day, week or month are restored from its rows. Keys with a lifetime ("total")
    # budget keep all their rows, which that budget is restored from.
    request_retention_days: float | None = Field(default=None, ge=32, le=36_500)
    retention_interval_s: float = Field(default=3600.0, gt=0)
    # How long an admin read (keys, spend, the dashboard), a generation lookup or feedback's
    # lookup of its request may wait on the database before it is a 503: a hung server
    # (a network partition, a stopped server keeping its sockets open) never answers.
    read_timeout_s: float = Field(default=30.0, gt=0)


_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def _redis_url(value: str | None) -> str | None:
    # Checked here, so a URL redis-py cannot use is one line at startup rather than a
    # traceback from inside the server's lifespan.
    if value is None:
        return value
    if not value.startswith(_REDIS_SCHEMES):
        raise ValueError(f"a Redis URL starts with {', '.join(_REDIS_SCHEMES)}")
    # Parsed as the client will parse it: a bad port or database crashed the lifespan.
    from gateway.limits.resp import parse_redis_url

    parse_redis_url(value)  # its ValueError names the part, never the password
    return value


class LimitsSettings(_Section):
    backend: Literal["memory", "redis"] = "memory"
    redis_url: Annotated[str, AfterValidator(_redis_url)] = "redis://127.0.0.1:6379/0"
    # What to do when Redis can't be reached: refuse requests (closed) or let them through
    # unmetered (open). Closed is the safe default for budgets.
    on_store_error: Literal["closed", "open"] = "closed"
    key_prefix: str = "xrouter"
    # How often each worker checks that the store still holds the budgets' spend counters
    # (a Redis flushed or restarted without persistence loses them; they are then restored
    # from the ledger). One EXISTS per check; the in-process store is restored at startup.
    budget_sync_s: float = Field(default=30.0, gt=0, le=3600)


class CacheSettings(_Section):
    """The exact-match answer cache (off by default, as in LiteLLM's proxy)."""

    enabled: bool = False
    backend: Literal["memory", "redis"] = "memory"
    # Redis for the shared cache; None: the limit store's (limits.redis_url).
    redis_url: Annotated[str | None, AfterValidator(_redis_url)] = None
    key_prefix: str = "xrouter:cache"
    ttl_s: float = Field(default=3600.0, gt=0, le=30 * 86400)
    # Whose requests share answers: each API key its own ("key"), or everyone ("global").
    scope: Literal["key", "global"] = "key"
    max_entry_bytes: int = Field(default=256 * 1024, ge=1024)
    # The in-process backend's bounds (per worker).
    max_entries: int = Field(default=10_000, ge=1)
    max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # A Redis lookup slower than this is a miss: the cache must never slow a request down.
    timeout_ms: float = Field(default=100.0, gt=0)
    # How long a request waits for an identical one already being answered (in the same
    # worker) rather than buying the same answer again; 0 turns the coalescing off.
    coalesce_wait_s: float = Field(default=30.0, ge=0, le=600)

    @model_validator(mode="after")
    def _check_sizes(self) -> CacheSettings:
        if self.backend == "memory" and self.max_entry_bytes > self.max_bytes:
            raise ValueError("cache.max_entry_bytes must not exceed cache.max_bytes")
        return self


class MetricsSettings(_Section):
    enabled: bool = True
    # Savings are measured against what this model would have cost for the same tokens.
    reference_model: str | None = None
    # Budget-remaining gauges are exported for at most this many keys (bounded cardinality).
    budget_gauge_keys: int = Field(default=20, ge=0, le=1000)
    # ... and re-read this often between the keys' calls (gateway.budget_gauges): a period's
    # reset, other replicas' spend, a budget changed elsewhere.
    budget_refresh_s: float = Field(default=60.0, gt=0, le=3600)
    # When set, GET /metrics needs "Authorization: Bearer <token>" (Prometheus: a scrape
    # config's `authorization.credentials_file`). Unset, it is open, as LiteLLM's is by
    # default: it shows key aliases, remaining budgets, models and deployment names.
    bearer_token: SecretStr | None = None

    @field_validator("bearer_token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        # Stripped as the admin key is: a token read from a file often ends with a newline,
        # which no Authorization header can carry (the scrape would be refused for good).
        token = value.get_secret_value().strip()
        # An empty ${VAR:-} would otherwise be a token that every scraper "knows".
        if len(token) < 16:
            raise ValueError("at least 16 characters (or null for an open /metrics)")
        return SecretStr(token)


class LLMRouterSettings(_Section):
    base_url: str | None = None
    model: str = "xrouter-router"
    api_key: SecretStr | None = None
    _strip = field_validator("api_key")(strip_secret)
    # Router tokens are part of the request's cost: a self-hosted price per 1M tokens.
    price: ModelPrice = ModelPrice.free("self-hosted router")
    temperature: float = Field(default=0.0, ge=0, le=2)
    # A router turn's output cap: what each turn asks the server for, and what a key's
    # budget holds for the turn's output before it is made.
    max_output_tokens: int = Field(default=4096, ge=16, le=131072)
    max_turns: int = Field(default=4, ge=1, le=16)
    timeout_s: float = Field(default=60.0, gt=0)
    # Retries of a router-model call that failed transiently (timeout, 5xx, 429, connection),
    # with the pool's backoff; past them the policy falls back to the last answer it has
    # bought, or to the pool's cheapest model.
    max_retries: int = Field(default=1, ge=0, le=5)
    # Idle connections to the router model's server are reused this long: below vLLM's own
    # 5 s (see the pool's ``keep_alive_s``).
    keep_alive_s: float = Field(default=DEFAULT_KEEP_ALIVE_S, gt=0, le=3600)
    system_prompt: str | None = None
    # A λ-conditioned router (trained on verl by training.verl) reads the request's cost
    # weight from its system prompt; prompt-engineered routers don't need it.
    cost_weight_in_prompt: bool = False

    @model_validator(mode="after")
    def _one_credential(self) -> LLMRouterSettings:
        # As for a pool model (router.pool): credentials in the base_url and an api_key
        # would be two Authorization headers, refused on every router turn — every request
        # would fall back to the cheapest model. Said at load, by name.
        key = self.api_key.get_secret_value() if self.api_key else ""
        if key and self.base_url and has_userinfo(self.base_url):
            raise ValueError(
                "its base_url carries credentials (user:password@) and it has an api_key "
                "too; the router model's server takes one Authorization header: keep one"
            )
        return self


class CircuitBreakerSettings(_Section):
    """router.health: a model whose calls keep failing is skipped for a while."""

    failures: int = Field(default=5, ge=0)  # consecutive failed attempts; 0 turns it off
    # At most a day: the shared circuit's expiry goes to Redis in milliseconds, and one as
    # long as 1e20 s is a number Redis refuses (the circuit was kept, but not shared).
    cooldown_s: float = Field(default=30.0, gt=0, le=86400)
    # With limits.backend: redis, workers and replicas tell each other when a circuit opens
    # (gateway/circuits.py), read every sync_interval_s.
    shared: bool = True
    sync_interval_s: float = Field(default=1.0, gt=0, le=3600)


class RewardSettings(_Section):
    """The reward the gateway logs with each feedback score (``router.reward``, the one
    definition training and evaluation use): the defaults are ``xrouter train``'s, so a
    logged reward is what the trainer's default reward makes of the same request."""

    form: Literal["gated", "additive"] = "gated"
    K: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    c_max: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    # USD that counts as one unit of normalized cost.
    cost_scale: float = Field(default=0.001, gt=0, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _lower_case_k(cls, data: Any) -> Any:
        # An environment override's path is lower-cased (XROUTER_ROUTER__REWARD__K arrives as
        # `k`); it overrides the file's `K`, as every environment override does.
        if isinstance(data, dict) and "k" in data:
            data = {**{n: v for n, v in data.items() if n != "k"}, "K": data["k"]}
        return data

    @model_validator(mode="after")
    def _valid_reward(self) -> RewardSettings:
        # The reward's own rules (a gated K of 0 pays a right answer no more than a wrong
        # one) are a settings error at load, not a failure when the first score comes in.
        self.config()
        return self

    def config(self) -> RewardConfig:
        return RewardConfig(form=self.form, K=self.K, c_max=self.c_max, cost_scale=self.cost_scale)


class RouterSettings(_Section):
    default_policy: str = "compact"
    cost_weight: float = Field(default=0.5, ge=0, le=MAX_COST_WEIGHT)  # as a request's own may be
    max_turns: int = Field(default=4, ge=1, le=16)
    checkpoint: str | None = None
    watch_files: bool = True
    # How often each worker reads the newest `xrouter deploy` from the ledger database.
    deployment_poll_s: float = Field(default=2.0, gt=0)
    # Exploration for the compact policy, so logged traffic supports off-policy learning:
    # ε-greedy mixing, or sampling from the softmax at ``temperature`` (``sample: true``).
    # The propensity of the chosen action is logged either way.
    epsilon: float = Field(default=0.0, ge=0, le=1)
    sample: bool = False
    temperature: float = Field(default=1.0, gt=0)
    cascade_order: list[str] = Field(default_factory=list)
    cascade_check: Literal["nonempty", "agreement"] = "agreement"
    llm: LLMRouterSettings = LLMRouterSettings()
    circuit_breaker: CircuitBreakerSettings = CircuitBreakerSettings()
    reward: RewardSettings = RewardSettings()
    # A deployment (pool entry `deployments:`) whose call failed is passed over for this long
    # while the model's other deployments can take its calls.
    deployment_cooldown_s: float = Field(default=5.0, gt=0, le=3600)

    @field_validator("cascade_order")
    @classmethod
    def _order_once(cls, v: list[str]) -> list[str]:
        # A cascade plan calls each model once: a repeat was accepted here and failed every
        # cascade request with a 500 (the plan refuses it), so it is a settings error.
        repeated = sorted({m for m in v if v.count(m) > 1})
        if repeated:
            raise ValueError(f"names a model more than once: {repeated}")
        return v


class PricingSettings(_Section):
    catalog: str | None = None
    overrides: dict[str, ModelPrice] = Field(default_factory=dict)


class DemoSettings(_Section):
    # Start the replay upstream as a child process and point every pool entry whose
    # api_base is "replay" at it. Only the demo config turns this on.
    replay_upstream: bool = False
    replay_table: str | None = None


class Settings(_Section):
    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    ledger: LedgerSettings = LedgerSettings()
    limits: LimitsSettings = LimitsSettings()
    cache: CacheSettings = CacheSettings()
    metrics: MetricsSettings = MetricsSettings()
    router: RouterSettings = RouterSettings()
    pricing: PricingSettings = PricingSettings()
    pool: list[PoolModelConfig] = Field(default_factory=list)
    demo: DemoSettings = DemoSettings()

    @model_validator(mode="after")
    def _check_pool(self) -> Settings:
        names = [m.name for m in self.pool]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate pool model names: {sorted(dupes)}")
        check_tool_names(names)  # the llm router's tools: one per model, by name
        reserved = {n for n in names if n == "xrouter" or n.startswith("xrouter/")}
        if reserved:
            raise ValueError(f"pool model names may not start with 'xrouter': {sorted(reserved)}")
        for m in self.pool:
            unknown = [f for f in m.fallbacks if f not in names]
            if unknown:
                raise ValueError(f"pool model {m.name!r} falls back to unknown models {unknown}")
        return self

    @model_validator(mode="after")
    def _check_limits_shared(self) -> Settings:
        # The in-process store is per worker: with several, each would enforce a key's whole
        # budget and rate limits on its own, multiplying them silently.
        if self.server.workers > 1 and self.auth.enabled and self.limits.backend == "memory":
            raise ValueError(
                "limits.backend: memory keeps budgets and rate limits per process; with "
                "server.workers > 1 use limits.backend: redis (or one worker)"
            )
        return self

    def pool_model(self, name: str) -> PoolModelConfig | None:
        for m in self.pool:
            if m.name == name:
                return m
        return None


def expand_env(value: Any, env: Mapping[str, str]) -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string of a YAML document."""
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            # As the shell and docker compose read ``:-``: the default when the variable is
            # unset or empty (Kubernetes and compose files often define variables as empty).
            if default is not None and not env.get(name):
                return default
            if name in env:
                return env[name]
            raise SettingsError(
                f"environment variable {name} is referenced in the config but not set"
            )

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [expand_env(v, env) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v, env) for k, v in value.items()}
    return value


# Types whose value is text: an environment value for one of them is taken as written.
_TEXT_TYPES: tuple[type, ...] = (str, SecretStr, PurePath, Url, MultiHostUrl)
# pydantic's URL, DSN, e-mail and IP address types (AnyUrl, PostgresDsn, ...), written as
# text too; its multi-host DSNs share no public base class, hence the module.
_TEXT_TYPES_MODULE = "pydantic.networks"


def _members(tp: Any) -> list[Any]:
    """The members of a type, ``Annotated`` unwrapped and ``None`` dropped."""
    if get_origin(tp) is Annotated:
        return _members(get_args(tp)[0])
    if get_origin(tp) in (Union, types.UnionType):
        return [m for arg in get_args(tp) for m in _members(arg)]
    return [] if tp is type(None) else [tp]


def _is_text(tp: Any) -> bool:
    """Whether a setting of type ``tp`` is written as text (``None`` allowed besides)."""
    members = _members(tp)
    if not members:
        return False
    for m in members:
        if get_origin(m) is Literal:
            if not all(isinstance(v, str) for v in get_args(m)):
                return False
        elif not (
            isinstance(m, type)
            and (issubclass(m, _TEXT_TYPES) or m.__module__ == _TEXT_TYPES_MODULE)
        ):
            return False
    return True


def _field_type(path: list[str]) -> Any:
    """The annotation of the setting at ``path`` (field names, or a mapping's keys), or
    ``None`` when the path names no setting (validation then says so)."""
    tp: Any = Settings
    for part in path:
        members = _members(tp)
        if len(members) != 1:
            return None
        (tp,) = members
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) is list and part.isdigit():  # XROUTER_POOL__0__API_KEY
            tp = get_args(tp)[0]
        else:
            return None
    return tp


def _env_value(path: list[str], raw: str) -> Any:
    # A text setting takes the value as written: through YAML, "key #2026" lost its
    # " #2026" as a comment, and an all-digit key or "yes" became a number or a boolean
    # that no string field accepts.
    if raw == "" or _is_text(_field_type(path)):
        return raw
    # Others are YAML-parsed so "true", "8", "[a, b]" get their natural types; one that is
    # not YAML ("[abc", "*") is the string it is.
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _apply_env_overrides(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        _set_path(data, path, _env_value(path, raw), key)
    return data


def _set_path(data: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    """Set the setting at ``path`` to ``value``, making the sections on the way. A list's
    entry is named by its index (``XROUTER_POOL__0__API_KEY``), and must exist: an override
    completes the file's entry, it cannot make one. A section the file gave as something
    else (``server:`` left empty, ``server: 8000``) is an error naming both, where it was
    replaced by the override (an env var) or crashed on it (a CLI flag)."""
    node: Any = data
    for depth, part in enumerate(path[:-1]):
        where = ".".join(path[: depth + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise SettingsError(
                    f"invalid configuration: {source} names {where}, but "
                    f"{'.'.join(path[:depth]) or '(root)'} has {len(node)} entries "
                    "(numbered from 0)"
                )
            nxt = node[int(part)]
        elif part not in node:
            nxt = node[part] = {}
        else:
            nxt = node[part]
        if not isinstance(nxt, dict | list):
            raise SettingsError(
                f"invalid configuration: {where}: should be a section, not "
                f"{'empty' if nxt is None else repr(nxt)} ({source} sets {'.'.join(path)})"
            )
        node = nxt
    if isinstance(node, list):
        raise SettingsError(
            f"invalid configuration: {source} names {'.'.join(path)}, an entry of a list: "
            "set a field of it, or the whole list"
        )
    node[path[-1]] = value


def _format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
    return "invalid configuration: " + "; ".join(parts)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last,
    so a second `ledger:` section dropped the first one's `url` without a word (spend
    written to a local SQLite file instead of the PostgreSQL the first one named)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<:` merge keys may repeat
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                continue  # the base class refuses an unhashable key, with its mark
            if key in seen:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_config(p: Path) -> dict[str, Any]:
    """A config file's YAML mapping, as written (``${VAR}``s not expanded)."""
    try:
        loaded = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except FileNotFoundError as exc:
        raise SettingsError(f"config file not found: {p}") from exc
    except IsADirectoryError as exc:
        raise SettingsError(f"config file {p} is a directory") from exc
    except OSError as exc:
        raise SettingsError(f"cannot read config file {p}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SettingsError(f"config file {p} is not UTF-8 text") from exc
    except yaml.YAMLError as exc:
        # Not ``{exc}``: PyYAML quotes the offending line, which may hold a secret, and
        # this message reaches logs and a reload's 400.
        raise SettingsError(f"config file {p} is not valid YAML: {yaml_problem(exc)}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise SettingsError(f"config file {p} must hold a mapping at the top level")
    return loaded or {}


def load_ledger_settings(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> LedgerSettings:
    """The config's ``ledger`` section alone, with its environment overrides: what `xrouter
    export` needs. The ``${VAR}``s of the other sections (a provider's API key, the replay
    upstream's URL) need not be set where an export runs — a cron job — nor the rest of the
    config be valid there."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        section = _read_config(Path(path)).get("ledger")
        if section is not None:
            data["ledger"] = expand_env(section, env)
    # Only the ledger's overrides: another section's (a bad XROUTER_POOL__5__API_KEY) is
    # not this command's to refuse.
    ours = {k: v for k, v in env.items() if k[len(ENV_PREFIX) :].lower().startswith("ledger__")}
    ledger = _apply_env_overrides(data, ours).get("ledger") or {}
    try:
        return Settings.model_validate({"ledger": ledger}).ledger
    except ValidationError as exc:  # named as load_settings names them: ledger.<field>
        raise SettingsError(_format_validation_error(exc)) from None


def load_settings(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build the settings from an optional YAML file, the environment and explicit overrides
    (the CLI's flags). Raises ``SettingsError`` with every problem in one message."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        data = expand_env(_read_config(Path(path)), env)
    data = _apply_env_overrides(data, env)
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(data, dotted.split("."), value, "the command line")
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise SettingsError(_format_validation_error(exc)) from None
