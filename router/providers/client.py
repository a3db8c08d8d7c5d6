"""Downstream calls with timeouts, retries with backoff, per-model concurrency limits and
fallbacks. Both the gateway's pass-through and the orchestration loop call through here."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Container, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, cast

from pricing import TokenUsage, tokens_for_chars
from router.health import BreakerConfig, CircuitBreakers
from router.pool import ModelPool, PoolModel
from router.providers.balance import DeploymentBalancer
from router.providers.base import InFlight, Provider, StreamStats
from router.providers.errors import (
    BACKOFF_MAX_S,
    DEPLOYMENT_LOCAL,
    ProviderError,
    retry_after_s,
    retry_delay,
    waits_too_long,
)
from router.providers.litellm_provider import LiteLLMProvider
from router.providers.native import NativeOpenAIProvider
from router.providers.usage import prompt_tokens_estimate

log = logging.getLogger(__name__)


class CallEvents(Protocol):
    """Where the client reports what happened (the gateway implements it with Prometheus).
    ``on_deployment`` is reported for models with several deployments only."""

    def on_retry(self, model: str, kind: str) -> None: ...
    def on_fallback(self, model: str) -> None: ...
    def on_upstream_error(self, model: str, kind: str) -> None: ...
    def on_circuit(self, model: str, state: str) -> None: ...
    def on_deployment(self, model: str, deployment: str, ok: bool) -> None: ...


class NullEvents:
    def on_retry(self, model: str, kind: str) -> None:
        pass

    def on_fallback(self, model: str) -> None:
        pass

    def on_upstream_error(self, model: str, kind: str) -> None:
        pass

    def on_circuit(self, model: str, state: str) -> None:
        pass

    def on_deployment(self, model: str, deployment: str, ok: bool) -> None:
        pass


def fallback_reason(fallback_from: str | None, errors: Sequence[ProviderError]) -> str | None:
    """Why a call that a fallback answered left ``fallback_from``, the model asked for: that
    model's first error — ``circuit_open`` when its circuit kept the call away and it was
    never called, which says nothing of how it answers. The chain tries the model asked for
    first and leaves it only on an error, so the call's first error is that model's."""
    if fallback_from is None or not errors:
        return None
    return errors[0].kind


@dataclass(slots=True)
class CallResult:
    model: str  # the pool model that answered
    body: dict[str, Any]
    usage: TokenUsage
    cost_micros: int
    latency_ms: float
    attempts: int
    fallback_from: str | None = None
    errors: list[ProviderError] = field(default_factory=list)
    deployment: str | None = None  # which of the model's deployments answered, if several

    @property
    def fallback_reason(self) -> str | None:
        return fallback_reason(self.fallback_from, self.errors)


@dataclass(slots=True)
class StreamCall:
    """An open stream: iterate ``chunks``; ``stats``/``model`` are final once it is exhausted.
    A stream holds a slot of its model's concurrency limit and an upstream HTTP response
    until it is exhausted, fails or is closed: a caller that stops reading, or never starts,
    closes it (``aclose``)."""

    model: PoolModel
    chunks: AsyncIterator[dict[str, Any]]
    stats: StreamStats
    attempts: int
    fallback_from: str | None
    errors: list[ProviderError]
    # The body sent upstream: the prompt is estimated from it only if usage never arrives.
    request: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fallback_reason(self) -> str | None:
        return fallback_reason(self.fallback_from, self.errors)

    @property
    def usage_estimated(self) -> bool:
        return self.stats.usage is None

    def usage(self) -> TokenUsage:
        """The provider's usage. A stream that ended before reporting it (the client hung up,
        the upstream broke off) was still paid for up to that point, so it is charged an
        estimate rather than nothing: the prompt from its characters, the completion from
        what was generated so far in every choice, text and tool-call arguments (at least a
        token per chunk that carried any). Otherwise a client could read a whole answer,
        drop the connection before the usage chunk and spend nothing against its budget."""
        st = self.stats
        if st.usage is not None:
            return st.usage
        relayed = max(st.generated_parts, tokens_for_chars(st.generated_chars))
        return TokenUsage(
            prompt_tokens=prompt_tokens_estimate(self.request), completion_tokens=relayed
        )

    def cost_micros(self) -> int:
        return self.model.price.cost_micros(self.usage())

    async def aclose(self) -> None:
        """Give back what the stream holds, whether it was read to the end, in part or not
        at all (idempotent)."""
        aclose = getattr(self.chunks, "aclose", None)
        if aclose is not None:
            await aclose()


def upstream_body(model: PoolModel, body: dict[str, Any]) -> dict[str, Any]:
    """The request as this upstream should see it: its own model id, output capped."""
    out = dict(body)
    out["model"] = model.upstream_model
    cap = model.max_output_tokens
    for k in ("max_tokens", "max_completion_tokens"):
        if k in out and out[k] is not None:
            out[k] = min(int(out[k]), cap)
    out.pop("xrouter", None)
    return out


class DownstreamClient:
    def __init__(
        self,
        pool: ModelPool,
        *,
        events: CallEvents | None = None,
        providers: dict[str, Provider] | None = None,
        backoff_base_s: float = 0.1,
        backoff_max_s: float = BACKOFF_MAX_S,
        sleep: Callable[[float], Any] = asyncio.sleep,
        breakers: CircuitBreakers | None = None,
        balancer: DeploymentBalancer | None = None,
    ) -> None:
        self.pool = pool
        self.events: CallEvents = events or NullEvents()
        # Off unless given: callers that build a client directly get plain retries.
        self.breakers = breakers or CircuitBreakers(BreakerConfig(failures=0))
        self._providers: dict[str, Provider] = providers or {
            "native": NativeOpenAIProvider(),
            "litellm": LiteLLMProvider(),
        }
        self.balancer = balancer or DeploymentBalancer()
        self._sem = {
            (t.name, t.deployment): asyncio.Semaphore(t.max_concurrency)
            for m in pool
            for t in m.targets
        }
        self._backoff_base = backoff_base_s
        self._backoff_max = backoff_max_s
        self._sleep = sleep
        self._no_usage_warned: set[str] = set()

    def with_pool(self, pool: ModelPool) -> DownstreamClient:
        """A client for a reloaded pool sharing this one's HTTP sessions."""
        return DownstreamClient(
            pool,
            events=self.events,
            providers=self._providers,
            backoff_base_s=self._backoff_base,
            backoff_max_s=self._backoff_max,
            sleep=self._sleep,
            breakers=self.breakers,
            balancer=self.balancer,
        )

    def _warn_no_usage(self, model: str) -> None:
        if model not in self._no_usage_warned:
            self._no_usage_warned.add(model)
            log.warning(
                "upstream %s returned no usage: its calls are charged estimated tokens "
                "(characters / 4) until it does",
                model,
            )

    def provider(self, transport: str) -> Provider:
        return self._providers[transport]

    def _chain(self, name: str, allowed: Container[str] | None = None) -> list[PoolModel]:
        """``name`` and its configured fallbacks, leaving out the ones the request may not use
        (its ``xrouter.models``, its key's allowed models, the modalities it needs): a
        fallback is a substitute for the model, not a way around the request's limits."""
        first = self.pool[name]
        chain = [first]
        for fb in first.fallbacks:
            m = self.pool.get(fb)
            if m is not None and m not in chain and (allowed is None or fb in allowed):
                chain.append(m)
        return chain

    def _short_circuit(self, model: PoolModel, errors: list[ProviderError]) -> bool:
        """True (and the refusal recorded as this model's error) when the model's circuit
        is open: the caller moves on to the next fallback without calling it."""
        if self.breakers.allow(model.name):
            return False
        errors.append(
            ProviderError(
                "circuit_open",
                f"{model.name} is temporarily not called: its recent calls failed",
                model=model.name,
            )
        )
        self.events.on_upstream_error(model.name, "circuit_open")
        return True

    def _delay(self, attempt: int, err: ProviderError) -> float:
        return retry_delay(attempt, err, self._backoff_base, self._backoff_max)

    def _deployment_done(self, target: PoolModel, err: ProviderError | None) -> None:
        """Book a deployment's call: a failure another deployment may not share (the
        upstream's trouble, or a refusal of this deployment's account: 401, 403, 404) cools
        it down — for as long as its ``retry-after`` asked, if longer — a success ends its
        cooldown."""
        if target.deployment is None:
            return
        if err is None:
            self.balancer.succeeded(target)
        elif err.retryable or err.kind in DEPLOYMENT_LOCAL:
            self.balancer.failed(target, retry_after_s(err))
        self.events.on_deployment(target.name, target.deployment, err is None)

    async def _tries(
        self, name: str, allowed: Container[str] | None, errors: list[ProviderError]
    ) -> AsyncGenerator[_Try, None]:
        """The attempts of one call, in order: ``name``'s deployments and retries, then each
        fallback's (those in ``allowed``, when given). The caller makes each attempt; a
        failed one it books with :meth:`_attempt_failed` (which appends to ``errors``) and
        asks for the next, which comes after the backoff that failure calls for, or not at
        all when it was not retryable or the model's tries are spent (then the next model
        in the chain). A success it returns. One loop for plain calls and streams, so that
        they retry, fall back and back off alike.

        A model with several deployments is tried on each of them before the call gives up
        on it: a failure that leaves a deployment untried (the upstream's trouble, or a
        refusal of that deployment's account: 401, 403, 404) goes on to it at once. Such a
        failure is the deployment's (it cools down), not the model's: the circuit breaker
        is not told of it, nor asked again before the next deployment — so a half-open
        circuit's probe, too, goes on through every deployment, and the model's circuit
        counts a call only once every deployment has failed it. A deployment that refused
        the gateway, or asked (``retry-after``) for a longer wait than the backoff's cap, is
        not called again in this call; once none is left the call moves on to the fallback.
        """
        attempts = 0
        for i, model in enumerate(self._chain(name, allowed)):
            if i > 0:
                self.events.on_fallback(name)
                log.info("falling back from %s to %s", name, model.name)
            provider = self._providers[model.transport]
            tried: set[str | None] = set()
            # Deployments this call gives up on (a refusal, a wait longer than we retry after).
            skip: set[str | None] = set()
            tries = _attempts(model)
            admitted = False  # the circuit let this call through, nothing booked since
            for attempt in range(tries):
                if not admitted and self._short_circuit(model, errors):
                    break
                admitted = False
                attempts += 1
                target = self.balancer.pick(model, tried, skip)
                tried.add(target.deployment)
                yield _Try(model, target, provider, attempts)
                # Back here only when the attempt failed: the caller booked its error.
                err = errors[-1]
                local = err.kind in DEPLOYMENT_LOCAL and len(model.targets) > 1
                if local or waits_too_long(err, self._backoff_max):
                    skip.add(target.deployment)
                untried = any(t.deployment not in tried for t in model.targets)
                if (err.retryable or local) and untried and attempt < tries - 1:
                    # Another deployment may not share it: on to it at once.
                    self.events.on_retry(model.name, err.kind)
                    admitted = True
                    continue
                self.breakers.record_failure(model.name, err.kind)
                usable = any(t.deployment not in skip for t in model.targets)
                if not err.retryable or attempt == tries - 1 or not usable:
                    break
                self.events.on_retry(model.name, err.kind)
                await self._sleep(self._delay(attempt, err))

    def _attempt_failed(self, t: _Try, err: ProviderError, errors: list[ProviderError]) -> None:
        """Book a failed attempt's error (the circuit breaker's share is ``_tries``')."""
        err.deployment = t.target.deployment
        self._deployment_done(t.target, err)
        errors.append(err)
        self.events.on_upstream_error(t.model.name, err.kind)

    async def complete(
        self,
        name: str,
        body: dict[str, Any],
        allowed: Container[str] | None = None,
        in_flight: InFlight | None = None,
    ) -> CallResult:
        """Call ``name``, retrying retryable failures, then each fallback in turn (those in
        ``allowed``, when given). ``in_flight``, when given, says while an attempt's request
        is with its upstream (for a caller that may stop waiting)."""
        errors: list[ProviderError] = []
        async with aclosing(self._tries(name, allowed, errors)) as tries:
            async for t in tries:
                target, model = t.target, t.model
                req = upstream_body(target, body)
                self.balancer.started(target)
                try:
                    async with self._sem[(target.name, target.deployment)]:
                        if in_flight is not None:
                            in_flight.sent(model, target, req, t.number, _left(name, t, errors))
                        resp = await t.provider.complete(target, req)
                except ProviderError as err:
                    if in_flight is not None:
                        in_flight.failed()
                    self._attempt_failed(t, err, errors)
                    continue
                finally:
                    self.balancer.finished(target)
                self._deployment_done(target, None)
                self.breakers.record_success(model.name)
                if not resp.usage_reported:
                    self._warn_no_usage(model.name)
                return CallResult(
                    model=model.name,
                    body=resp.body,
                    usage=resp.usage,
                    cost_micros=model.price.cost_micros(resp.usage),
                    latency_ms=resp.latency_ms,
                    attempts=t.number,
                    fallback_from=name if model.name != name else None,
                    errors=errors,
                    deployment=target.deployment,
                )
        raise _gave_up(name, errors)

    async def open_stream(
        self,
        name: str,
        body: dict[str, Any],
        allowed: Container[str] | None = None,
        in_flight: InFlight | None = None,
    ) -> StreamCall:
        """Open a stream and wait for its first chunk that says something (see
        :func:`_read_head`). Retries and fallbacks (those in ``allowed``, when given) apply
        only until then: once tokens have reached the client, a failure can't be hidden.
        ``in_flight`` as for :meth:`complete`, until the stream is open (then the stream
        charges for itself: ``StreamCall.usage``)."""
        errors: list[ProviderError] = []
        async with aclosing(self._tries(name, allowed, errors)) as tries:
            async for t in tries:
                target, model = t.target, t.model
                req = upstream_body(target, body)
                req["stream"] = True
                # Ask for usage so cost comes from the provider, never from counting characters.
                req["stream_options"] = {
                    **(req.get("stream_options") or {}),
                    "include_usage": True,
                }
                stats = StreamStats()
                sem = self._sem[(target.name, target.deployment)]
                await sem.acquire()
                self.balancer.started(target)
                if in_flight is not None:
                    in_flight.sent(model, target, req, t.number, _left(name, t, errors))
                gen = t.provider.stream(target, req, stats)
                try:
                    head, ended = await _read_head(gen)
                except StopAsyncIteration:
                    sem.release()
                    self.balancer.finished(target)
                    err = ProviderError(
                        "bad_response",
                        f"upstream {model.name} sent an empty stream",
                        model=model.name,
                    )
                except ProviderError as e:
                    sem.release()
                    self.balancer.finished(target)
                    err = e
                except BaseException:
                    sem.release()
                    self.balancer.finished(target)
                    await _close(gen)
                    raise
                else:
                    # Success or failure is booked when the stream ends: a stream that breaks
                    # off mid-answer is a failed attempt for the circuit breaker and the
                    # deployment's cooldown, though it can no longer be retried.
                    return StreamCall(
                        model=target,
                        chunks=_StreamChunks(
                            head,
                            gen,
                            ended=ended,
                            release=partial(self._stream_released, sem, target),
                            booked=partial(self._stream_ended, model, target, stats),
                        ),
                        stats=stats,
                        attempts=t.number,
                        fallback_from=name if model.name != name else None,
                        errors=errors,
                        request=req,
                    )
                if in_flight is not None:
                    in_flight.failed()
                self._attempt_failed(t, err, errors)
        raise _gave_up(name, errors)

    def _stream_released(self, sem: asyncio.Semaphore, target: PoolModel) -> None:
        sem.release()
        self.balancer.finished(target)

    def _stream_ended(
        self,
        model: PoolModel,
        target: PoolModel,
        stats: StreamStats,
        err: ProviderError | None,
        exhausted: bool,
    ) -> None:
        """Book an opened stream's outcome. A failure after the first chunk (the upstream
        cut the answer, timed out or sent a bad event) counts as a failed attempt; a stream
        read to the end, or given up on by the caller, as a success: the upstream answered.
        One read to the end without a usage chunk comes from an upstream that reports none,
        said once per model as for plain calls."""
        self._deployment_done(target, err)
        if err is not None:
            err.deployment = target.deployment
            stats.error_kind = err.kind
        if err is None:
            self.breakers.record_success(model.name)
            if exhausted and stats.usage is None:
                self._warn_no_usage(model.name)
        else:
            self.events.on_upstream_error(model.name, err.kind)
            self.breakers.record_failure(model.name, err.kind)

    async def aclose(self) -> None:
        for p in self._providers.values():
            await p.aclose()


@dataclass(slots=True, frozen=True)
class _Try:
    """One attempt of a call: the pool model (the one asked for, or a fallback), the
    deployment of it to call, its transport, and how many attempts the call has made."""

    model: PoolModel
    target: PoolModel
    provider: Provider
    number: int


def _left(name: str, t: _Try, errors: Sequence[ProviderError]) -> str | None:
    """Why attempt ``t`` of a call to ``name`` is a fallback's: ``name``'s first error (see
    :func:`fallback_reason`); None when it is ``name``'s own."""
    return fallback_reason(name if t.model.name != name else None, errors)


def _gave_up(name: str, errors: list[ProviderError]) -> ProviderError:
    """The error a call to ``name`` ends with, once every model in its chain failed or was
    skipped: the last attempt that reached an upstream — a circuit that opened after it, or
    a fallback skipped for one, says less about why — with how many attempts there were,
    whether any of them failed on something that passes (``transient``) and, when the
    chain went on to a fallback, why it left ``name`` (``fallback_reason``): the error may
    be a fallback's, and only the reason says whether ``name`` was called at all."""
    made = [e for e in errors if e.kind != "circuit_open"]
    err = made[-1] if made else errors[-1]
    err.attempts = len(made)
    fell_back = any(e.model != name for e in errors)
    err.fallback_reason = fallback_reason(name if fell_back else None, errors)
    # Asking again may help if any upstream tried failed last on trouble that passes (a
    # deployment's 503 before the other's 401; not a 503 the same deployment followed with
    # a 401, its latest word) or any model was skipped for an open circuit, which closes.
    latest = {(e.model, e.deployment): e for e in made}
    err.transient = any(e.retryable for e in latest.values()) or len(made) < len(errors)
    return err


def _attempts(model: PoolModel) -> int:
    """Tries of one model per call: its retries, and at least one per deployment."""
    return max(model.max_retries + 1, len(model.deployments))


# Chunks read ahead, at most, while a stream says nothing: past them it is open anyway.
_MAX_HEAD = 16


def _says_nothing(chunk: dict[str, Any]) -> bool:
    """A chunk the client could be sent again from another attempt without telling: no
    usage, no finish, and deltas that hold at most a role (OpenAI opens every stream with
    ``{"role": "assistant", "content": ""}``)."""
    if chunk.get("usage"):
        return False
    for choice in chunk.get("choices") or ():
        if choice.get("finish_reason"):
            return False
        delta = choice.get("delta") or {}
        if any(v for k, v in delta.items() if k != "role"):
            return False
    return True


async def _read_head(gen: AsyncIterator[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """A new stream's first chunks, up to the first that says something, and whether the
    upstream ended it meanwhile. Nothing has reached the client yet, so a failure here is
    retried and falls back like one before the first chunk: an upstream that sends its
    role and then breaks off (an overload, a dropped connection) is asked again, not
    relayed as a cut answer. Raises StopAsyncIteration for a stream without a chunk."""
    head: list[dict[str, Any]] = []
    while True:
        try:
            chunk = await anext(gen)
        except StopAsyncIteration:
            if not head:
                raise
            return head, True  # relayed as it came, as before
        head.append(chunk)
        if not _says_nothing(chunk) or len(head) >= _MAX_HEAD:
            return head, False


class _StreamChunks:
    """An opened stream's chunks: its head (already read, see :func:`_read_head`), then the
    rest as the upstream sends them. Holds the stream's concurrency slot, its count in
    flight and the upstream response until the stream ends — exhausted, failed, or closed —
    and books its outcome then. Unlike an async generator, whose ``finally`` never runs if
    it was never started, closing it before the first read (a client that left before the
    stream began) gives everything back too."""

    def __init__(
        self,
        head: list[dict[str, Any]],
        gen: AsyncIterator[dict[str, Any]],
        *,
        ended: bool = False,
        release: Callable[[], None],
        booked: Callable[[ProviderError | None, bool], None],
    ) -> None:
        self._head = deque(head)
        self._gen = gen
        self._exhausted = ended  # the upstream ended the stream while its head was read
        self._release = release
        self._booked = booked
        self._open = True

    def __aiter__(self) -> _StreamChunks:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self._open:
            raise StopAsyncIteration
        if self._head:
            return self._head.popleft()
        try:
            if self._exhausted:
                raise StopAsyncIteration
            return await anext(self._gen)
        except StopAsyncIteration:
            await self._end(None, exhausted=True)
            raise
        except ProviderError as err:
            await self._end(err)
            raise
        except BaseException:
            # Cancelled while waiting (the request's deadline, a client that left): given
            # up on by the caller, not failed by the upstream.
            await self._end(None)
            raise

    async def aclose(self) -> None:
        await self._end(None)

    async def _end(self, err: ProviderError | None, *, exhausted: bool = False) -> None:
        if not self._open:
            return
        self._open = False
        self._head.clear()
        self._release()
        self._booked(err, exhausted)
        # Closing the upstream generator closes the HTTP response: a client that disconnects
        # cancels the upstream call instead of letting it run to the end.
        await _close(self._gen)

    def __del__(self) -> None:
        # A safety net for a caller that dropped the stream without closing it: the slot
        # and the count in flight come back (the provider's generator, collected too,
        # closes its response). Said loudly, since the caller has a bug.
        if getattr(self, "_open", False):
            self._open = False
            log.warning("a stream was dropped without being closed; releasing its slot")
            try:
                self._release()
            except RuntimeError:  # its event loop is gone: so is everyone waiting on it
                pass


async def _close(gen: AsyncIterator[Any]) -> None:
    if isinstance(gen, AsyncGenerator):
        await cast(AsyncGenerator[Any, None], gen).aclose()
