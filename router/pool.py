"""The model pool: the downstream models a router may call, with their prices."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from pricing import CatalogError, ModelPrice, PriceCatalog
from router.modalities import Modality, OutputModality, accepts, produces

# Providers whose API is OpenAI's chat completions: with an api_base they take the native
# async fast path; everything else goes through LiteLLM's translation.
OPENAI_COMPATIBLE = frozenset(
    {
        "openai",
        "hosted_vllm",
        "vllm",
        "together_ai",
        "groq",
        "deepseek",
        "fireworks_ai",
        "openrouter",
        "mistral",
        "xai",
        "nvidia_nim",
        "custom_openai",
        "lm_studio",
        "ollama_chat",
    }
)


# Idle upstream connections are reused for this long by default; see
# ``PoolModelConfig.keep_alive_s``.
DEFAULT_KEEP_ALIVE_S = 4.0


def has_userinfo(url: str) -> bool:
    """Whether ``url`` names a user (and password) before its host: user:secret@host."""
    try:
        return urlsplit(url).username is not None
    except ValueError:
        return False


def strip_secret(value: SecretStr | None) -> SecretStr | None:
    """A credential without surrounding whitespace (a pydantic validator). One read from a
    file (a Kubernetes secret, `$(cat key)`) often ends with a newline, which no
    Authorization header can carry: such a key never matches, and an HTTP client refuses
    the header with an error that quotes it."""
    return None if value is None else SecretStr(value.get_secret_value().strip())


class DeploymentConfig(BaseModel):
    """One place a pool model is served (a vLLM replica, a second provider account, another
    region). The router picks the model; the gateway picks among its deployments."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _strip = field_validator("api_key")(strip_secret)

    api_base: str
    api_key: SecretStr | None = None  # None: the pool entry's
    model: str | None = None  # the upstream's id for the model, when it differs
    max_concurrency: int | None = Field(default=None, ge=1)  # None: the pool entry's
    # Its name in metrics and logs (bounded by the config); default: the api_base's host.
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,63}$")

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        # host[:port] only: the label reaches metrics, the ledger and responses, and an
        # api_base may carry credentials (http://user:secret@host/v1) or a query string.
        url = urlsplit(self.api_base)
        try:
            port = url.port
        except ValueError:
            port = None
        host = url.hostname or "deployment"
        return (f"{host}:{port}" if port is not None else host)[:64]


class PoolModelConfig(BaseModel):
    """One downstream model as configured."""

    # No inf or NaN: an infinite timeout_s is no timeout, and overflows where it is used.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _strip = field_validator("api_key")(strip_secret)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,63}$")
    # provider/model as LiteLLM spells it: openai/gpt-4o-mini, anthropic/claude-3-5-haiku, ...
    model: str
    api_base: str | None = None
    api_key: SecretStr | None = None
    # native: our async OpenAI-compatible fast path; litellm: translation for every other
    # provider; auto: native for OpenAI-compatible providers that have an api_base.
    transport: Literal["auto", "native", "litellm"] = "auto"
    # None = look the model up in the price catalog; 0 = explicitly free (self-hosted).
    price: ModelPrice | None = None
    max_output_tokens: int = Field(default=4096, ge=1)
    timeout_s: float = Field(default=60.0, gt=0)
    max_concurrency: int = Field(default=256, ge=1)
    max_retries: int = Field(default=2, ge=0, le=10)
    # How long an idle connection to the upstream is kept for reuse (native transport). Keep
    # it below the upstream's own idle timeout: a call sent on a connection the upstream is
    # closing at that moment fails (retried, but counted as an upstream error and toward the
    # circuit breaker). vLLM, SGLang and other uvicorn servers close idle connections after
    # 5 s; measured against one, 1 call in ~1,500 sent after a 4.8-5.2 s pause failed with
    # 30 s here and none with 4 s. The OpenAI SDK itself keeps connections 5 s.
    keep_alive_s: float = Field(default=DEFAULT_KEEP_ALIVE_S, gt=0, le=3600)
    fallbacks: list[str] = Field(default_factory=list)
    description: str = ""
    # What the model can read: text, image, audio. Unset: not declared, any request may be
    # routed to it; set: requests carrying other kinds of input are not.
    input_modalities: tuple[Modality, ...] | None = None
    # What the model can answer with: text, audio. Unset: not declared, any request may be
    # routed to it; set: a request asking for other kinds of output (``modalities``) is not.
    output_modalities: tuple[OutputModality, ...] | None = None
    # The most tokens (prompt plus output) the model takes. Unset: not declared, any request
    # may be routed to it; set: a request too long for it is not (router.context_window).
    context_window: int | None = Field(default=None, ge=1)
    # Several deployments of this model: calls are balanced between them (the least busy
    # first), a deployment that fails is skipped for router.deployment_cooldown_s, and a
    # failed call is retried on another. Each deployment has its own api_base (the entry's
    # own api_base is then not set); api_key, model id and concurrency default to the entry's.
    deployments: tuple[DeploymentConfig, ...] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _deployments(self) -> PoolModelConfig:
        if self.deployments is None:
            return self
        if self.api_base is not None:
            raise ValueError("give api_base per deployment, not on a pool entry with deployments")
        labels = [d.label for d in self.deployments]
        if len(set(labels)) != len(labels):
            raise ValueError(f"deployment names must differ (set `name:`): {labels}")
        return self

    @model_validator(mode="after")
    def _one_credential(self) -> PoolModelConfig:
        # Credentials in an api_base (http://user:secret@host/v1) are sent as HTTP Basic
        # auth, an api_key as a bearer token: both would be two Authorization headers, which
        # the HTTP clients refuse on every call. Said here, by name, rather than per request.
        targets = [(self.api_base, self.api_key, None)] + [
            (d.api_base, d.api_key or self.api_key, d.label) for d in self.deployments or ()
        ]
        for api_base, api_key, deployment in targets:
            # An empty key (an unset ${VAR}) is none: no bearer token is sent for it.
            if api_key and api_key.get_secret_value() and api_base and has_userinfo(api_base):
                where = f" (deployment {deployment!r})" if deployment else ""
                raise ValueError(
                    f"pool model {self.name!r}{where}: its api_base carries credentials "
                    "(user:password@) and it has an api_key too; an upstream takes one "
                    "Authorization header: keep one of them"
                )
        return self

    @field_validator("input_modalities")
    @classmethod
    def _reads_text(cls, v: tuple[Modality, ...] | None) -> tuple[Modality, ...] | None:
        if v is not None and "text" not in v:
            raise ValueError("input_modalities must include text")
        return v

    @field_validator("output_modalities")
    @classmethod
    def _writes_text(
        cls, v: tuple[OutputModality, ...] | None
    ) -> tuple[OutputModality, ...] | None:
        if v is not None and "text" not in v:
            raise ValueError("output_modalities must include text")
        return v

    @field_validator("price", mode="before")
    @classmethod
    def _zero_means_free(cls, v: Any) -> Any:
        if v == 0 or v == "0":
            return ModelPrice.free()
        if isinstance(v, int | float | str) and not isinstance(v, bool):
            # `price: 0` is the only shorthand; any other number (`price: -1`, `price: 2`)
            # was "Input should be a valid dictionary or instance of ModelPrice".
            raise ValueError(
                "price is {input: USD, output: USD} per 1M tokens, or 0 for a free "
                f"(self-hosted) model; got {v!r}"
            )
        return v


@dataclass(frozen=True, slots=True)
class PoolModel:
    """A pool model resolved against the price catalog, ready to be called."""

    name: str
    provider: str
    upstream_model: str
    api_base: str | None
    api_key: str | None = field(repr=False)
    transport: Literal["native", "litellm"]
    price: ModelPrice
    max_output_tokens: int
    timeout_s: float
    max_concurrency: int
    max_retries: int
    fallbacks: tuple[str, ...]
    description: str
    input_modalities: frozenset[Modality] | None = None
    output_modalities: frozenset[OutputModality] | None = None
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    context_window: int | None = None
    # The model as each of its deployments serves it (same name and price; their own
    # api_base, key, upstream id, concurrency, and ``deployment`` label); () for one.
    deployments: tuple[PoolModel, ...] = ()
    deployment: str | None = None

    def accepts(self, needed: frozenset[Modality]) -> bool:
        return accepts(self.input_modalities, needed)

    def produces(self, needed: frozenset[OutputModality]) -> bool:
        return produces(self.output_modalities, needed)

    @property
    def targets(self) -> tuple[PoolModel, ...]:
        """Where a call to this model may go: its deployments, or the model itself."""
        return self.deployments or (self,)

    @property
    def litellm_model(self) -> str:
        return f"{self.provider}/{self.upstream_model}"

    @classmethod
    def from_config(cls, cfg: PoolModelConfig, catalog: PriceCatalog) -> PoolModel:
        provider, sep, upstream = cfg.model.partition("/")
        if not sep:
            provider, upstream = "openai", cfg.model
        if cfg.deployments:
            # Resolved against the first deployment's api_base (the transport depends on
            # having one), then once per deployment.
            first = cfg.deployments[0]
            base = cls.from_config(
                cfg.model_copy(update={"deployments": None, "api_base": first.api_base}), catalog
            )
            return dataclasses.replace(
                base,
                deployments=tuple(
                    dataclasses.replace(
                        base,
                        api_base=d.api_base.rstrip("/"),
                        api_key=d.api_key.get_secret_value() if d.api_key else base.api_key,
                        upstream_model=d.model or base.upstream_model,
                        max_concurrency=d.max_concurrency or base.max_concurrency,
                        deployment=d.label,
                    )
                    for d in cfg.deployments
                ),
            )
        price = cfg.price
        if price is None:
            price = catalog.get(cfg.name) or catalog.get(cfg.model) or catalog.get(upstream)
        if price is None:
            raise CatalogError(
                f"pool model {cfg.name!r} ({cfg.model}) has no price: set `price:` in its pool "
                "entry, add it to the catalog, or say `price: 0` if it is self-hosted"
            )
        transport: Literal["native", "litellm"]
        if cfg.transport == "auto":
            native = provider in OPENAI_COMPATIBLE and (
                cfg.api_base is not None or provider == "openai"
            )
            transport = "native" if native else "litellm"
        else:
            transport = cfg.transport
        if transport == "native" and cfg.api_base is None and provider != "openai":
            raise CatalogError(f"pool model {cfg.name!r}: the native transport needs an api_base")
        return cls(
            name=cfg.name,
            provider=provider,
            upstream_model=upstream,
            api_base=(cfg.api_base or "https://api.openai.com/v1").rstrip("/"),
            api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
            transport=transport,
            price=price,
            max_output_tokens=cfg.max_output_tokens,
            timeout_s=cfg.timeout_s,
            max_concurrency=cfg.max_concurrency,
            max_retries=cfg.max_retries,
            fallbacks=tuple(cfg.fallbacks),
            description=cfg.description,
            input_modalities=(
                None if cfg.input_modalities is None else frozenset(cfg.input_modalities)
            ),
            output_modalities=(
                None if cfg.output_modalities is None else frozenset(cfg.output_modalities)
            ),
            keep_alive_s=cfg.keep_alive_s,
            context_window=cfg.context_window,
        )


class ModelPool:
    """An ordered, immutable set of pool models. Order is stable: it is the action index
    of learned policies, so a checkpoint can check it was trained on the same pool."""

    def __init__(self, models: Iterable[PoolModel]) -> None:
        self._models = {m.name: m for m in models}

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __iter__(self) -> Iterator[PoolModel]:
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def get(self, name: str) -> PoolModel | None:
        return self._models.get(name)

    def __getitem__(self, name: str) -> PoolModel:
        return self._models[name]

    def subset(self, names: Sequence[str]) -> ModelPool:
        """The pool restricted to ``names`` (keeping pool order)."""
        wanted = set(names)
        return ModelPool(m for m in self if m.name in wanted)

    def cheapest(self) -> PoolModel:
        return min(self, key=lambda m: (m.price.input + m.price.output, m.name))

    def price_snapshot(self) -> dict[str, dict[str, str]]:
        return {m.name: {"input": str(m.price.input), "output": str(m.price.output)} for m in self}

    @classmethod
    def from_configs(cls, configs: Iterable[PoolModelConfig], catalog: PriceCatalog) -> ModelPool:
        return cls(PoolModel.from_config(c, catalog) for c in configs)
