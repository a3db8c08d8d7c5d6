"""LiteLLM transport: breadth (Anthropic, Bedrock, Vertex, ...) for providers whose API is
not OpenAI's. Imported lazily, because importing LiteLLM costs seconds and ~100 MB, and a
pool of OpenAI-compatible models never needs it."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from typing import Any

from router.pool import PoolModel
from router.providers.base import Provider, ProviderResponse, StreamStats
from router.providers.errors import ProviderError, sanitize

# Parameters of an OpenAI request that LiteLLM takes as keyword arguments.
_PASS_THROUGH = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
    "seed",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "logprobs",
    "top_logprobs",
    "stream_options",
    "reasoning_effort",
)


def preload_litellm() -> None:
    """Import LiteLLM now, off the request path: called while a runtime is built (before the
    server starts, or in a worker thread on reload) when the pool has a model on this
    transport, so the first call does not stall the event loop for the import's seconds."""
    _litellm()


def _litellm() -> Any:
    # Never fetch the remote cost map at import: we ship our own catalog, and the network
    # may be closed.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    # LiteLLM prices every response itself, and for models it doesn't know it counts tokens
    # with a Hugging Face tokenizer it downloads synchronously, on the event loop. We price
    # from our own catalog with the provider's usage, so keep that download from happening.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import litellm

    litellm.suppress_debug_info = True
    litellm.drop_params = True
    return litellm


def _map_exception(exc: Exception, model: PoolModel) -> ProviderError:
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    detail = sanitize(str(getattr(exc, "message", "") or exc), model.api_key)
    msg = f"upstream {model.name} failed ({name}): {detail}"
    if "Timeout" in name:
        return ProviderError(
            "timeout",
            f"upstream {model.name} timed out after {model.timeout_s:g}s",
            model=model.name,
        )
    if "Connection" in name and not isinstance(status, int):
        return ProviderError("connection", msg, model=model.name)
    if isinstance(status, int):
        if status == 429:
            return ProviderError("rate_limited", msg, model=model.name, status=status)
        if status == 404:
            return ProviderError("not_found", msg, model=model.name, status=status)
        if status >= 500:
            return ProviderError("upstream_5xx", msg, model=model.name, status=status)
        if status == 408:
            return ProviderError("timeout", msg, model=model.name, status=status)
        return ProviderError("upstream_4xx", msg, model=model.name, status=status)
    return ProviderError("connection", msg, model=model.name)


class LiteLLMProvider(Provider):
    def _kwargs(self, model: PoolModel, body: dict[str, Any]) -> dict[str, Any]:
        kwargs: dict[str, Any] = {k: body[k] for k in _PASS_THROUGH if k in body}
        kwargs.update(
            model=model.litellm_model,
            messages=body["messages"],
            timeout=model.timeout_s,
            # DownstreamClient owns retries and fallbacks: none in LiteLLM or the OpenAI SDK.
            num_retries=0,
            max_retries=0,
        )
        if model.api_base:
            kwargs["api_base"] = model.api_base
        if model.api_key:
            kwargs["api_key"] = model.api_key
        return kwargs

    async def complete(self, model: PoolModel, body: dict[str, Any]) -> ProviderResponse:
        litellm = _litellm()
        start = time.perf_counter()
        try:
            resp = await litellm.acompletion(**self._kwargs(model, body))
        except Exception as exc:  # LiteLLM raises many types; all become ProviderError
            raise _map_exception(exc, model) from None
        data = resp.model_dump(exclude_none=True)
        data.pop("_hidden_params", None)
        latency = (time.perf_counter() - start) * 1000
        return ProviderResponse.parse(body, data, latency)

    async def stream(
        self, model: PoolModel, body: dict[str, Any], stats: StreamStats
    ) -> AsyncIterator[dict[str, Any]]:
        litellm = _litellm()
        start = time.perf_counter()
        kwargs = self._kwargs(model, body)
        kwargs["stream"] = True
        kwargs["stream_options"] = {"include_usage": True}
        try:
            resp = await litellm.acompletion(**kwargs)
            async for chunk in resp:
                data = chunk.model_dump(exclude_none=True)
                if stats.ttft_ms is None:
                    stats.ttft_ms = (time.perf_counter() - start) * 1000
                stats.observe(data)
                yield data
        except ProviderError:
            raise
        except Exception as exc:
            raise _map_exception(exc, model) from None
        finally:
            stats.latency_ms = (time.perf_counter() - start) * 1000
