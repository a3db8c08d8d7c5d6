"""LiteLLM transport: breadth (Anthropic, Bedrock, Vertex, ...) for providers whose API is
not OpenAI's. Imported lazily, because importing LiteLLM costs seconds and ~100 MB, and a
pool of OpenAI-compatible models never needs it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from router.pool import PoolModel
from router.providers.base import Provider, ProviderResponse, StreamStats
from router.providers.content_parts import flatten_parts
from router.providers.errors import (
    ErrorKind,
    ProviderError,
    client_error_kind,
    could_not_call,
    model_secrets,
    parse_retry_after,
    sanitize,
)
from router.providers.usage import zero_usage

log = logging.getLogger(__name__)

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


def _retry_after(exc: Exception) -> float | None:
    # The upstream's retry-after, which the native path honours too: LiteLLM keeps the
    # response's headers on the error.
    headers = getattr(exc, "litellm_response_headers", None)
    if headers is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
    getter = getattr(headers, "get", None)
    return parse_retry_after(getter("retry-after")) if callable(getter) else None


def _links(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions behind it, outermost first (a bounded walk: chains can be
    cyclic). LiteLLM wraps what went wrong a few links down its own exceptions."""
    out: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(out) < 8:
        out.append(link)
        link = link.__cause__ or link.__context__
    return out


def _from_openai_sdk(link: BaseException) -> bool:
    # LiteLLM's exceptions subclass the OpenAI SDK's: only the SDK's own stand for what
    # happened on the wire.
    return type(link).__module__.split(".")[0] == "openai"


def _lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a connection that failed before any HTTP answer. LiteLLM
    reports one (the OpenAI SDK's ``APIConnectionError``) as an ``InternalServerError`` with
    status 500 and the original a few links down its exception chain."""
    import openai  # LiteLLM's own dependency, loaded with it

    for link in _links(exc):
        if isinstance(link, openai.APIConnectionError):
            return True
        if isinstance(link, openai.APIStatusError) and link is not exc:
            return False  # an upstream did answer, with an error status
    return False


# What Python raises when code meets data it did not expect: at the bottom of a LiteLLM
# error, a response or stream event it could not read (``'NoneType' object has no
# attribute 'delta'``, a JSONDecodeError), or a request it could not build.
_UNEXPECTED = (ValueError, TypeError, AttributeError, KeyError, IndexError)


def _on_the_wire(links: list[BaseException]) -> bool:
    """Whether the network or an upstream's HTTP status is behind the failure: then it is
    what the status or the connection says, whatever else the chain holds (an error body
    that was not JSON leaves a JSONDecodeError in the chain of a real 502)."""
    import httpx  # the OpenAI SDK's, loaded with LiteLLM
    import openai

    wire = (httpx.TransportError, httpx.HTTPStatusError, aiohttp.ClientError, OSError)
    for link in links:
        if isinstance(link, wire) or isinstance(link, HttpProcessingError):
            return True
        if isinstance(link, openai.APIStatusError | openai.APIConnectionError) and (
            _from_openai_sdk(link)
        ):
            return True
    return False


def _unreadable(links: list[BaseException], reading: bool) -> bool:
    """Whether LiteLLM failed on what the upstream sent: a body that is not JSON, an answer
    that is not a completion (LiteLLM's "Invalid response object"), or — while a stream is
    read — an event it could not take apart. LiteLLM calls these a 500, or a connection
    error in a stream; the native transport, and this one now, a ``bad_response``."""
    if _on_the_wire(links):
        return False
    for link in links:
        if isinstance(link, json.JSONDecodeError):
            return True
        if str(link).startswith("Invalid response object"):
            return True
    return reading and isinstance(links[-1], _UNEXPECTED)


def _refused_locally(links: list[BaseException]) -> BaseException | None:
    """The exception at the bottom of a failure that happened before any request went out,
    or None: the OpenAI SDK's own ``OpenAIError`` (missing credentials), or an error
    raised while the request was being built (aiohttp refusing an Authorization header
    beside credentials in the api_base). LiteLLM reports these as 500s."""
    import openai

    if _on_the_wire(links):
        return None
    root = links[-1]
    if type(root) is openai.OpenAIError or isinstance(root, _UNEXPECTED):
        return root
    return None


def _map_exception(exc: Exception, model: PoolModel, *, reading: bool = False) -> ProviderError:
    """The ProviderError of a LiteLLM failure, of the kind the native path gives the same
    failure: 408 a timeout, a connection lost (before or after the first chunk) a
    ``connection`` failure, an answer or stream event LiteLLM could not read a
    ``bad_response``, a call refused before it went out (missing credentials) an
    ``upstream_4xx`` (the gateway's setup: neither retried nor counted by the circuit
    breaker), the upstream's ``retry-after`` kept. ``reading``: the failure came while a
    stream was being read."""
    inner = getattr(exc, "original_exception", None)
    if type(exc).__name__ == "MidStreamFallbackError" and isinstance(inner, Exception):
        # A stream's failure comes wrapped as a 500-ish "fallback" error: what happened is
        # the exception inside (for a cut stream, a connection error).
        exc = inner
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    retry_after = _retry_after(exc)
    if "Timeout" in name or status == 408:
        return ProviderError(
            "timeout",
            f"upstream {model.name} timed out after {model.timeout_s:g}s",
            model=model.name,
            retry_after=retry_after,
        )
    links = _links(exc)
    # LiteLLM's own failures carry its default status, 500 (or none); any other status is
    # the upstream's answer.
    if status in (None, 500) and _unreadable(links, reading):
        # Only what failed, not the parser's words for it ("Expecting property name…").
        what = "stream event" if reading else "response"
        return ProviderError(
            "bad_response", f"upstream {model.name} sent an invalid {what}", model=model.name
        )
    if status in (None, 500) and (root := _refused_locally(links)) is not None:
        return could_not_call(model, root)
    detail = sanitize(str(getattr(exc, "message", "") or exc), *model_secrets(model))
    msg = f"upstream {model.name} failed ({name}): {detail}"
    if "Connection" in name or _lost_connection(exc):
        # LiteLLM gives its connection errors a status of 500; nothing answered with one.
        return ProviderError("connection", msg, model=model.name)
    if isinstance(status, int):
        kind: ErrorKind
        if status == 429:
            kind = "rate_limited"
        elif status == 404:
            kind = "not_found"
        elif status >= 500:
            kind = "upstream_5xx"
        else:
            kind = client_error_kind(status)
        return ProviderError(kind, msg, model=model.name, status=status, retry_after=retry_after)
    return ProviderError("connection", msg, model=model.name)


def _no_answer(model: PoolModel) -> ProviderError:
    # LiteLLM (1.110) returns None, rather than raising, when an OpenAI-compatible upstream
    # answered 422 both to the request and to its retry without the parameters the 422
    # named (``drop_params``): no answer to parse, and no status left to go by.
    return ProviderError(
        "bad_response", f"upstream {model.name} gave no answer through LiteLLM", model=model.name
    )


def _counted_by_litellm(resp: Any) -> bool:
    """Whether a stream's usage is LiteLLM's own count rather than the upstream's.

    Asked for ``include_usage``, LiteLLM ends every stream with a usage chunk; when the
    upstream reported none, it fills that in by running its tokenizer over the text. Such
    counts are estimates, however good, and are booked as estimates. The upstream chunks
    LiteLLM has received are in its stream wrapper's ``chunks``: when none carries usage,
    the upstream reported none. A LiteLLM without that list is taken at its word."""
    chunks = getattr(resp, "chunks", None)
    if not isinstance(chunks, list):
        return False
    return not any(getattr(c, "usage", None) is not None for c in chunks)


def _usage_or_none(data: dict[str, Any]) -> None:
    """Drop the all-zero usage LiteLLM fills in when the upstream reported none, so that the
    call is charged the estimate, as on the native path, instead of nothing. (No real call
    has zero prompt tokens, so a zero usage never stands for a count.)"""
    if zero_usage(data.get("usage")):
        del data["usage"]


def _made_up_ending(resp: Any, chunk: dict[str, Any]) -> bool:
    """Whether ``chunk``, the first LiteLLM hands over, is LiteLLM's own: when the upstream's
    stream ends before its first event, LiteLLM does not fail but makes up a closing chunk
    (finish_reason "stop", an empty delta) without having received any finish reason, which
    would pass for a complete, empty answer. The native path calls that a cut stream."""
    choices = chunk.get("choices") or []
    if len(choices) != 1 or choices[0].get("delta") or not choices[0].get("finish_reason"):
        return False
    # LiteLLM's record of the finish reasons it received; absent (another version), the
    # chunk is taken as the upstream's.
    received = getattr(resp, "received_finish_reason", "unknown")
    return received is None and getattr(resp, "intermittent_finish_reason", None) is None


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
        if resp is None:
            raise _no_answer(model)
        data = resp.model_dump(exclude_none=True)
        data.pop("_hidden_params", None)
        _openai_choices(data, stream=False)
        _usage_or_none(data)
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
        # As on the native path: timeout_s bounds the whole wait for the first chunk (LiteLLM's
        # read timeout restarts with every SSE comment), then the gaps between chunks.
        first_by: float | None = asyncio.get_running_loop().time() + model.timeout_s
        resp: Any = None
        reading = False  # True once the stream is open: a failure now is in its events
        try:
            async with asyncio.timeout_at(first_by):
                resp = await litellm.acompletion(**kwargs)
            if resp is None:
                raise _no_answer(model)
            chunks = aiter(resp)
            reading = True
            while True:
                if first_by is None:
                    chunk = await anext(chunks, None)
                else:
                    # Never held across a yield: the consumer's task runs other code there.
                    async with asyncio.timeout_at(first_by):
                        chunk = await anext(chunks, None)
                if chunk is None:
                    break
                data = chunk.model_dump(exclude_none=True)
                _openai_choices(data, stream=True)
                # LiteLLM passes an OpenAI-compatible server's content parts through as
                # they came: relayed as the native transport relays them, a string.
                flatten_parts(data)
                if first_by is not None and _made_up_ending(resp, data):
                    raise ProviderError(
                        "connection",
                        f"upstream {model.name} closed the stream before its first event",
                        model=model.name,
                    )
                first_by = None
                _usage_or_none(data)
                if "usage" in data and _counted_by_litellm(resp):
                    # Not the upstream's count: charged as a missing usage is (an estimate,
                    # flagged as one, with a warning), as on the native transport.
                    del data["usage"]
                    if not data.get("choices"):
                        continue  # a usage-only chunk: nothing left to relay
                if stats.ttft_ms is None:
                    stats.ttft_ms = (time.perf_counter() - start) * 1000
                stats.observe(data)
                yield data
        except ProviderError:
            raise
        except TimeoutError as exc:
            if first_by is not None:
                raise ProviderError(
                    "timeout",
                    f"upstream {model.name} sent no data within {model.timeout_s:g}s",
                    model=model.name,
                ) from None
            raise _map_exception(exc, model, reading=reading) from None
        except Exception as exc:
            raise _map_exception(exc, model, reading=reading) from None
        finally:
            stats.latency_ms = (time.perf_counter() - start) * 1000
            # Closing LiteLLM's stream closes its HTTP response now (a client that left, a
            # stream given up on), rather than whenever the garbage collector gets to it.
            aclose = getattr(resp, "aclose", None)
            if callable(aclose):
                try:
                    await aclose()
                except Exception as exc:  # the call's own outcome matters, not this
                    log.debug("closing a LiteLLM stream failed: %r", exc)


def _openai_choices(data: dict[str, Any], *, stream: bool) -> None:
    """LiteLLM's objects dumped without their ``None``s (most are LiteLLM's own, which no
    OpenAI client expects), in the shape OpenAI sends, as the native transport relays it:
    the nullable fields OpenAI always sends are put back (``finish_reason`` on every
    chunk's choice, a message's ``content`` beside its tool calls, ``refusal``,
    ``logprobs``) and LiteLLM's ``provider_specific_fields`` are dropped."""
    data.pop("provider_specific_fields", None)
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        choice.pop("provider_specific_fields", None)
        choice.setdefault("finish_reason", None)
        choice.setdefault("logprobs", None)
        inner = choice.get("delta" if stream else "message")
        if isinstance(inner, dict):
            inner.pop("provider_specific_fields", None)
            if not stream:
                inner.setdefault("content", None)
                inner.setdefault("refusal", None)
