"""Native async fast path for OpenAI-compatible endpoints (OpenAI, vLLM, Together, Groq, ...).

A plain pooled aiohttp forward costs well under a millisecond of CPU per call, against
~10 ms for ``litellm.acompletion``; providers that need no translation take this path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp.http_exceptions import HttpProcessingError

from router.pool import PoolModel
from router.providers.base import Provider, ProviderResponse, StreamStats, chunk_problem
from router.providers.content_parts import flatten_answer, flatten_parts
from router.providers.errors import (
    ErrorKind,
    ProviderError,
    client_error_kind,
    could_not_call,
    model_secrets,
    parse_retry_after,
    sanitize,
)
from router.providers.trace_context import forwarded_headers

_JSON = {"Content-Type": "application/json"}

# The largest stream event (one SSE line) taken from an upstream. One delta can carry a whole
# tool call's arguments or an image, megabytes, far past aiohttp's own line limit (512 KiB,
# a LineTooLong that is not a ClientError); the bound stays so that an upstream that never
# sends a newline cannot make the gateway buffer without end.
MAX_EVENT_BYTES = 8 * 1024 * 1024


def _retry_after(headers: Any) -> float | None:
    return parse_retry_after(headers.get("retry-after") if headers is not None else None)


def chat_url(api_base: str | None) -> str:
    """The chat completions endpoint under ``api_base``, before its query string
    (``http://h/v1?key=k`` → ``http://h/v1/chat/completions?key=k``): appended after it, the
    path became part of the query's last value and every call was a 404."""
    base = api_base or ""
    if "?" not in base and "#" not in base:
        return f"{base}/chat/completions"
    url = urlsplit(base)
    # The pool strips a trailing slash off an api_base, which leaves one before a query.
    path = f"{url.path.rstrip('/')}/chat/completions"
    return urlunsplit(url._replace(path=path, fragment=""))


def status_error(status: int, text: str, model: PoolModel, headers: Any = None) -> ProviderError:
    """Map an upstream HTTP status to a ProviderError with a sanitized message."""
    detail = text
    try:
        err = orjson.loads(text).get("error")
        if isinstance(err, dict) and err.get("message"):
            detail = str(err["message"])
        elif isinstance(err, str):
            detail = err
    except (orjson.JSONDecodeError, AttributeError):
        pass
    message = f"upstream {model.name} returned {status}: {sanitize(detail, *model_secrets(model))}"
    kind: ErrorKind
    if status == 429:
        kind = "rate_limited"
    elif status == 404:
        kind = "not_found"
    elif status >= 500:
        kind = "upstream_5xx"
    elif status == 408:
        # Request Timeout: the upstream gave up waiting, as a timeout of ours would (LiteLLM
        # maps it the same way); worth a retry.
        kind = "timeout"
    else:
        kind = client_error_kind(status)
    return ProviderError(
        kind, message, model=model.name, status=status, retry_after=_retry_after(headers)
    )


def _timeout(model: PoolModel) -> ProviderError:
    return ProviderError(
        "timeout", f"upstream {model.name} timed out after {model.timeout_s:g}s", model=model.name
    )


def _malformed(model: PoolModel, exc: HttpProcessingError) -> ProviderError:
    # aiohttp's parser refusing what the upstream sent is not a ClientError: without this it
    # would reach the client as a raw 500 instead of a bad response that falls back.
    return ProviderError(
        "bad_response",
        f"upstream {model.name} sent a malformed response ({type(exc).__name__})",
        model=model.name,
    )


class _EventTooLarge(Exception):
    pass


class _Lines:
    """A response body's lines, none longer than ``limit`` bytes. aiohttp's line iterator
    stops at 512 KiB and takes a limit per call only in recent versions, so the lines are
    split here, from the chunks as they arrive: only the line being read is buffered."""

    def __init__(self, content: aiohttp.StreamReader, limit: int) -> None:
        self._content = content
        self._limit = limit
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already searched for a newline
        self._eof = False

    async def readline(self) -> bytes:
        """The next line with its newline; the unterminated rest at the end; b"" after it."""
        while True:
            i = self._buf.find(b"\n", self._scanned)
            if i >= 0:
                line = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buf)
            if self._scanned > self._limit:
                raise _EventTooLarge
            if self._eof:
                line = bytes(self._buf)
                self._buf.clear()
                self._scanned = 0
                return line
            data = await self._content.readany()
            if data:
                self._buf += data
            else:
                self._eof = True


def _unreachable(model: PoolModel, exc: BaseException) -> ProviderError:
    # Only the exception's type: its text can carry the upstream's address.
    return ProviderError(
        "connection",
        f"could not reach upstream {model.name} ({type(exc).__name__})",
        model=model.name,
    )


class NativeOpenAIProvider(Provider):
    def __init__(self) -> None:
        # One pooled session per idle timeout: every pool model shares one unless it sets its
        # own ``keep_alive_s`` (aiohttp's idle timeout is per connector, not per host).
        self._sessions: dict[float, aiohttp.ClientSession] = {}

    def _client(self, model: PoolModel) -> aiohttp.ClientSession:
        # Created lazily inside the running loop.
        session = self._sessions.get(model.keep_alive_s)
        if session is None or session.closed:
            session = self._sessions[model.keep_alive_s] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, ttl_dns_cache=300, keepalive_timeout=model.keep_alive_s
                ),
                json_serialize=lambda o: orjson.dumps(o).decode(),
                auto_decompress=True,
            )
        return session

    @staticmethod
    def _headers(model: PoolModel) -> dict[str, str]:
        # Credentials in the api_base (http://user:secret@host/v1) are aiohttp's to send: it
        # takes them out of the URL and sends them as HTTP Basic auth. A model with an
        # api_key as well is refused when the pool is loaded (router.pool): one request
        # carries one Authorization header.
        headers = _JSON
        if model.api_key:
            headers = {**headers, "Authorization": f"Bearer {model.api_key}"}
        trace = forwarded_headers()
        if trace:
            headers = {**headers, **trace}  # the request's W3C trace context, as it came
        return headers

    async def complete(self, model: PoolModel, body: dict[str, Any]) -> ProviderResponse:
        url = chat_url(model.api_base)
        start = time.perf_counter()
        try:
            async with self._client(model).post(
                url,
                data=orjson.dumps(body),
                headers=self._headers(model),
                timeout=aiohttp.ClientTimeout(total=model.timeout_s),
            ) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise status_error(
                        resp.status, raw.decode("utf-8", "replace"), model, resp.headers
                    )
        except ProviderError:
            raise
        except TimeoutError:
            raise _timeout(model) from None
        except aiohttp.ClientError as exc:
            raise _unreachable(model, exc) from None
        except HttpProcessingError as exc:
            raise _malformed(model, exc) from None
        except Exception as exc:
            raise could_not_call(model, exc) from None
        try:
            data = orjson.loads(raw)
            if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
                raise ValueError("no choices")
            for choice in data["choices"]:
                if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
                    raise ValueError("a choice without a message object")
        except (orjson.JSONDecodeError, ValueError):
            raise ProviderError(
                "bad_response", f"upstream {model.name} sent an invalid response", model=model.name
            ) from None
        flatten_answer(data)  # content parts: text, as the stream relays them
        latency = (time.perf_counter() - start) * 1000
        return ProviderResponse.parse(body, data, latency)

    async def stream(
        self, model: PoolModel, body: dict[str, Any], stats: StreamStats
    ) -> AsyncIterator[dict[str, Any]]:
        url = chat_url(model.api_base)
        start = time.perf_counter()
        # sock_read bounds the gap between chunks rather than the whole (possibly long) stream.
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=model.timeout_s, sock_read=model.timeout_s
        )
        # But not the wait for the first data event: every SSE comment (": keep-alive")
        # restarts a read timeout, so an upstream that sends only those would hold the call,
        # and its retries and fallbacks, forever. Comments before the first data event are
        # timed against timeout_s from the start (checked as each arrives: no timer per read
        # on the hot path; silence is sock_read's to end). None once data came.
        loop = asyncio.get_running_loop()
        first_by: float | None = loop.time() + model.timeout_s
        try:
            async with self._client(model).post(
                url, data=orjson.dumps(body), headers=self._headers(model), timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    raw = await resp.read()
                    raise status_error(
                        resp.status, raw.decode("utf-8", "replace"), model, resp.headers
                    )
                if resp.content_type == "application/json":
                    # A server that ignores `stream: true` answers with one JSON body: no
                    # `data:` line, which read as a stream "closed early" (a connection
                    # failure: retried, and counted against the model's circuit).
                    raise ProviderError(
                        "bad_response",
                        f"upstream {model.name} answered a stream request with a JSON body, "
                        "not an event stream: does it take `stream: true`?",
                        model=model.name,
                    )
                lines = _Lines(resp.content, MAX_EVENT_BYTES)
                done = False
                while True:
                    line = await lines.readline()
                    if not line:
                        break
                    if not line.startswith(b"data:"):
                        if first_by is not None and loop.time() > first_by:
                            raise ProviderError(
                                "timeout",
                                f"upstream {model.name} sent no data within {model.timeout_s:g}s",
                                model=model.name,
                            )
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        done = True
                        break
                    chunk = self._event(model, payload)
                    first_by = None
                    if stats.ttft_ms is None:
                        stats.ttft_ms = (time.perf_counter() - start) * 1000
                    stats.observe(chunk)
                    yield chunk
                if not done:
                    raise ProviderError(
                        "connection",
                        f"upstream {model.name} closed the stream early",
                        model=model.name,
                    )
        except TimeoutError:
            raise _timeout(model) from None
        except aiohttp.ClientError as exc:
            raise _unreachable(model, exc) from None
        except _EventTooLarge:
            raise ProviderError(
                "bad_response",
                f"upstream {model.name} sent a stream event over "
                f"{MAX_EVENT_BYTES // (1024 * 1024)} MiB",
                model=model.name,
            ) from None
        except HttpProcessingError as exc:
            raise _malformed(model, exc) from None
        except ProviderError:
            raise
        except Exception as exc:
            raise could_not_call(model, exc) from None
        finally:
            stats.latency_ms = (time.perf_counter() - start) * 1000

    @staticmethod
    def _event(model: PoolModel, payload: bytes) -> dict[str, Any]:
        """One ``data:`` event as a chunk the gateway can relay, or the ProviderError it is."""
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise ProviderError(
                "bad_response",
                f"upstream {model.name} sent an invalid stream event",
                model=model.name,
            ) from None
        if isinstance(chunk, dict) and "error" in chunk and not chunk.get("choices"):
            err = (
                chunk["error"]
                if isinstance(chunk["error"], dict)
                else {"message": str(chunk["error"])}
            )
            raise ProviderError(
                "upstream_5xx",
                f"upstream {model.name} failed mid-stream: {sanitize(str(err.get('message')), *model_secrets(model))}",
                model=model.name,
            )
        problem = chunk_problem(chunk)
        if problem is not None:
            raise ProviderError(
                "bad_response",
                f"upstream {model.name} sent an invalid stream event: {problem}",
                model=model.name,
            )
        # Before anything reads it (the stats, the relay, the translations): content as
        # parts is relayed as OpenAI streams it, a string.
        flatten_parts(chunk)
        return chunk  # chunk_problem found an object

    async def aclose(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            if not session.closed:
                await session.close()
        if sessions:
            # Give the connectors a tick to close their transports cleanly.
            await asyncio.sleep(0)
