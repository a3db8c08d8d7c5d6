"""Offline evaluation of real routing policies through the one orchestration loop.

``router.loop.Orchestrator`` with an ``OutcomeExecutor`` replays each call from the recorded
outcomes, so a policy is evaluated by exactly the code that serves it: its decisions, its
fallbacks, multi-call trajectories and their summed costs. Loaders for ``xrouter eval``:

- ``compact:<checkpoint>``  a compact checkpoint of any kind (greedy; ``cascade``
                            checkpoints run their multi-call plans);
- ``policy:<name>``         a router baseline through the loop: ``cascade``, ``cheapest``,
                            ``random``, ``fixed:<model>``;
- ``llm:<base_url>[#model[#options]]`` an ``llm`` router endpoint (any OpenAI-compatible
                            server with tool calling); answers the router writes itself have
                            no recorded score and count as 0, a lower bound. Options, comma
                            separated: ``lambda`` (the router reads the cost weight from its
                            system prompt) and ``price=IN/OUT`` (its USD per 1M tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import urllib.parse
from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

from pricing import ModelPrice, load_default_catalog
from router.executors import OutcomeExecutor
from router.loop import Orchestrator
from router.outcomes import OutcomeRecord
from router.policy import Call, Decision, LoopState, Policy, RouteContext
from router.pool import ModelPool, PoolModel
from router.route_result import NoAnswer, RouteResult
from router.tools import check_tool_names
from router.url_secrets import mask_userinfo
from training.evaluation.overlap import read_seen_prompts
from training.evaluation.registry import (
    LoadContext,
    RouterLoader,
    RouterSpecError,
    check_table_model,
)
from training.evaluation.sweep import Route, RoutedPrompt, RoutingError, is_full_information

logger = logging.getLogger(__name__)


def pool_for(records: Sequence[OutcomeRecord]) -> ModelPool:
    """A pool of the table's models. Calls are replayed at their recorded cost; prices come
    from the catalog where it knows the model, else from the mean recorded cost per prompt
    (per 1,000 tokens), which is enough to order models for cheapest and cascade."""
    catalog = load_default_catalog()
    costs: dict[str, list[float]] = {}
    for r in records:
        for m, o in r.outcomes.items():
            if o.cost_usd is not None:
                costs.setdefault(m, []).append(o.cost_usd)
    models = []
    for m in sorted({m for r in records for m in r.outcomes}):
        price = catalog.get(m)
        if price is None:
            if not costs.get(m):
                # A price of 0 would make it free to every policy that reads prices (the
                # cheapest first, an RL rollout's pool): refuse rather than guess.
                raise ValueError(
                    f"model {m!r} has no recorded cost_usd and no price in the packaged "
                    "catalog: price its outcomes first (xrouter eval and verl-data --prices)"
                )
            per_token = Decimal(str(statistics.fmean(costs[m]))) * 1000
            price = ModelPrice(input=per_token, output=per_token, source="recorded mean cost")
        models.append(replay_model(m, price))
    return ModelPool(models)


def replay_model(name: str, price: ModelPrice) -> PoolModel:
    """A pool model whose calls are replayed from a table (no upstream)."""
    return PoolModel(
        name=name,
        provider="openai",
        upstream_model=name,
        api_base=None,
        api_key=None,
        transport="native",
        price=price,
        max_output_tokens=4096,
        timeout_s=60,
        max_concurrency=1024,
        max_retries=0,
        fallbacks=(),
        description="",
    )


class LoopRouter:
    """An ``OfflineRouter`` that runs a ``Policy`` through the orchestration loop."""

    def __init__(
        self, name: str, make_policy: Callable[[ModelPool], Policy], max_turns: int = 4
    ) -> None:
        self.name = name
        self._make_policy = make_policy
        self.max_turns = max_turns
        # How the policy was trained (a checkpoint's metadata), to detect evaluation on
        # prompts it was fitted on.
        self.training: dict[str, Any] = {}
        # The hashes of the prompts it was fitted and selected on, where its checkpoint
        # directory keeps them (``training.evaluation.overlap``): found in any table.
        self.seen_prompts: np.ndarray | None = None
        # Where its checkpoint came from (``checkpoint_source``), shown beside the name,
        # which carries only the content version: runs are told apart by their paths.
        self.source: str | None = None
        # Router-model failures over every route() call (a whole λ sweep). Serving falls
        # back when the router model fails, which is right for availability but would make
        # an evaluation score the fallback under the router's name: they are counted and
        # reported (``notes``), and a sweep point where the router never answered is refused.
        self._routed = 0
        self._router_failed = 0
        self._last_router_error = ""
        # Table models a checkpoint was not trained on: it never chooses them.
        self.untrained: set[str] = set()
        # The models the policy routes among, and their prices: the whole table's, set by
        # ``xrouter eval``. On logged traffic the evaluated part alone lacks the models
        # nobody explored there, and a checkpoint denied them would be estimated as a policy
        # it is not; on any table its mean costs would differ from the ones `xrouter
        # verl-data` put in an llm router's tool descriptions. None: the routed records'.
        self.pool: ModelPool | None = None

    @property
    def notes(self) -> list[str]:
        """What the evaluation report should say about this router's runs."""
        out = []
        if self.untrained:
            out.append(
                f"{self.name}: not trained on {', '.join(sorted(self.untrained))}: it never "
                "chooses them, and routes among the table's other models"
            )
        if self._router_failed:
            out.append(
                f"{self.name}: the router model failed on {self._router_failed} of "
                f"{self._routed} routed prompts over the sweep (last error: "
                f"{self._last_router_error}); the serving loop's fallback answered those, so "
                "its curve is partly the fallback's"
            )
        return out

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> Sequence[Route]:
        if not is_full_information(records):
            return asyncio.run(self._choices(records, cost_weight))
        return asyncio.run(self._route(records, cost_weight))

    async def _choices(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        """Logged traffic (partial feedback): the model the policy picks for each prompt, for
        the off-policy estimators. The table holds only the logged model's outcome, so
        nothing is replayed: the policy is asked for its first step, as the serving loop asks
        it, over every model of the table (restricting each prompt to the models it has an
        outcome for would hand every policy the logged action). A policy whose first step is
        not one final call (a cascade's plan, an llm router's turns) has no single action to
        estimate, and is refused."""
        pool = self.pool if self.pool is not None else pool_for(records)
        policy = self._make_policy(pool)
        choices: list[str] = []
        try:
            for r in records:
                ctx = RouteContext(
                    request_id=r.id,
                    messages=r.chat_messages(),
                    pool=pool,
                    cost_weight=cost_weight,
                    max_turns=self.max_turns,
                )
                state = LoopState(Decision(policy.name, cost_weight, policy.feature_version))
                step = await policy.step(ctx, state)
                if not (isinstance(step, Call) and step.final and len(step.calls) == 1):
                    raise RoutingError(
                        f"record {r.id!r}: the policy's first step is not a single final call "
                        f"({type(step).__name__}); multi-call trajectories cannot be evaluated "
                        "off-policy"
                    )
                choices.append(step.calls[0].model)
        finally:
            await policy.aclose()
        return choices

    async def _route(
        self, records: Sequence[OutcomeRecord], cost_weight: float
    ) -> list[RoutedPrompt]:
        # The whole table's pool when the caller set it (``xrouter eval``): the prices an
        # llm router reads are then those `xrouter verl-data` trained it with.
        pool = self.pool if self.pool is not None else pool_for(records)
        policy = self._make_policy(pool)
        orchestrator = Orchestrator(OutcomeExecutor({r.id: r for r in records}))
        out: list[RoutedPrompt] = []
        router_ok = router_failed = 0
        try:
            for r in records:
                ctx = RouteContext(
                    request_id=r.id,
                    messages=r.chat_messages(),
                    pool=pool.subset(list(r.outcomes)),
                    cost_weight=cost_weight,
                    max_turns=self.max_turns,
                )
                result: RouteResult | None
                try:
                    result = await orchestrator.run(policy, ctx)
                    state = result.state
                except NoAnswer as exc:
                    result, state = None, exc.state
                failures = [o for o in state.router_calls if not o.ok]
                router_ok += len(state.router_calls) - len(failures)
                if failures:
                    router_failed += 1
                    self._last_router_error = failures[-1].error or failures[-1].error_kind or ""
                called = [o.model for o in state.outcomes if o.ok]
                unread = [m for m in called if r.outcomes[m].response is None]
                if len(called) > 1 and unread:
                    # A trajectory of several calls was steered by their answers (the
                    # cascade's agreement check, an llm router reading a tool's result);
                    # replayed without them it is the policy's response to empty answers,
                    # scored under its name. Refused, as the offline cascade refuses it.
                    raise RoutingError(
                        f"record {r.id!r}: model {unread[0]!r} has no recorded response (a "
                        "policy that calls several models reads their answers)"
                    )
                # The router's own tokens count in the cost, as in the gateway's ledger and
                # the RL reward (a priced router model; policies without one cost nothing).
                router_cost = sum(o.cost_micros for o in state.router_calls) / 1e6
                if result is not None and result.final_model is not None:
                    routed = RoutedPrompt.from_calls(r, called, final_model=result.final_model)
                    out.append(dataclasses.replace(routed, cost_usd=routed.cost_usd + router_cost))
                else:
                    # The router answered itself (or nothing succeeded): no recorded score.
                    cost = sum(r.outcomes[m].cost_usd or 0.0 for m in called)
                    out.append(
                        RoutedPrompt(
                            final_model="router",
                            models_called=tuple(called),
                            cost_usd=cost + router_cost,
                            score=0.0,
                        )
                    )
        finally:
            await policy.aclose()
        self._routed += len(records)
        self._router_failed += router_failed
        if router_failed and not router_ok:
            raise RoutingError(
                f"the router model never answered at cost weight {cost_weight:g} "
                f"({self._last_router_error})"
            )
        return out


def checkpoint_source(path: Path, most: int = 48) -> str:
    """A checkpoint's location as the report shows it: ``packaged:<name>`` for a shipped
    one; else the run directory (a checkpoint named ``checkpoint``, as ``xrouter train``
    writes it, is its run), relative to the working directory where it lies under it, and
    cut to its last components, after an ellipsis, when longer than ``most`` characters."""
    from router.checkpoint import PACKAGED_PREFIX, is_packaged

    if is_packaged(str(path)):
        return PACKAGED_PREFIX + path.name
    if path.name == "checkpoint":
        path = path.parent
    try:
        text = str(path.resolve().relative_to(Path.cwd().resolve()))
    except (OSError, ValueError):
        text = str(path)
    parts = Path(text).parts
    for k in range(len(parts) - 1, 0, -1):
        if len(text) <= most:
            break
        text = str(Path("…", *parts[-k:]))
    return text


def _compact(spec: str, ctx: LoadContext) -> LoopRouter:
    from router.checkpoint import load_checkpoint
    from router.features import FeatureConfig, FeatureExtractor
    from router.policies.checkpointed import policy_for_checkpoint

    ckpt = load_checkpoint(spec.removeprefix("compact:"))
    kind = ckpt.architecture.kind
    label = "compact" if kind == "mlp" else f"compact-{kind}"  # the report says which kind
    # The policy is rebuilt for each swept λ (a fresh pool per record list); the feature
    # extractor it reads from disk is the same every time, so it is loaded once.
    extractors: list[FeatureExtractor] = []

    def make(pool: ModelPool) -> Policy:
        if not extractors:
            extractors.append(
                FeatureExtractor.load(FeatureConfig.from_dict(ckpt.metadata.feature_config))
            )
        policy = policy_for_checkpoint(ckpt, pool, extractor=extractors[0])
        router.untrained.update(policy.untrained)
        return policy

    router = LoopRouter(f"{label}[{ckpt.version}]", make)
    router.training = dict(ckpt.metadata.training)
    if ckpt.path is not None:
        router.source = checkpoint_source(ckpt.path)
    if ckpt.path is not None and ckpt.path.is_dir():
        router.seen_prompts = read_seen_prompts(ckpt.path)
    return router


def _policy(spec: str, ctx: LoadContext) -> LoopRouter | None:
    from router.policies.baselines import CascadePolicy, CheapestPolicy, FixedPolicy, RandomPolicy

    name = spec.removeprefix("policy:")
    factories: dict[str, Callable[[ModelPool], Policy]] = {
        "cascade": lambda pool: CascadePolicy(check="agreement"),
        "cheapest": lambda pool: CheapestPolicy(),
        "random": lambda pool: RandomPolicy(seed=ctx.seed),
    }
    if name.startswith("fixed:"):
        model = name.removeprefix("fixed:")
        if not model:
            raise RouterSpecError(f"{spec!r}: fixed:<model> needs a model name")
        # FixedPolicy answers nothing for a model not in the pool: say so before a run
        # that would report a router that never answered.
        check_table_model(spec, model, ctx)
        return LoopRouter(spec, lambda pool: FixedPolicy(model))
    if name not in factories:
        return None
    return LoopRouter(spec, factories[name])


LLM_SPEC = "llm:BASE_URL[#MODEL[#OPTIONS]], OPTIONS a comma-separated list of lambda, price=IN/OUT"


def parse_llm_spec(spec: str) -> tuple[str, str, bool, ModelPrice | None]:
    """``llm:BASE_URL[#MODEL[#OPTIONS]]`` -> (base URL, model, reads λ, explicit price).

    ``lambda``: a router trained on verl reads the cost weight from its system prompt
    (``router.llm.cost_weight_in_prompt`` when served). ``price=IN/OUT``: the router model's
    USD per 1M input / output tokens, as ``router.llm.price`` in the gateway's config and
    ``xrouter verl-data --router-price`` in training, so all three score the same trajectory
    at the same cost.
    """
    shown = mask_userinfo(spec)  # what messages say: the URL without its password
    base, _, rest = spec.removeprefix("llm:").partition("#")
    model, _, options = rest.partition("#")
    if not base:
        raise ValueError(f"{shown}: expected {LLM_SPEC}")
    parts = urllib.parse.urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        # Caught here, not as an "invalid URL" on every prompt of the sweep.
        raise ValueError(
            f"{shown}: the router's base URL must be http(s)://host[:port][/path]; "
            f"expected {LLM_SPEC}"
        )
    reads_lambda, price = False, None
    for option in filter(None, (o.strip() for o in options.split(","))):
        key, eq, value = option.partition("=")
        if option == "lambda":
            reads_lambda = True
        elif key == "price" and eq:
            try:
                price_in, price_out = (Decimal(v) for v in value.split("/"))
                if not (price_in.is_finite() and price_out.is_finite()):
                    raise ValueError("not a finite price")
                price = ModelPrice(input=price_in, output=price_out, source="eval spec")
            except (ValueError, ArithmeticError) as exc:
                raise ValueError(
                    f"{shown}: price is two non-negative USD prices per 1M tokens, IN/OUT"
                ) from exc
        else:
            raise ValueError(f"{shown}: unknown option {option!r}; expected {LLM_SPEC}")
    return base.rstrip("/"), model or "xrouter-router", reads_lambda, price


def _llm(spec: str, ctx: LoadContext) -> LoopRouter:
    from router.policies.llm import LLMRouterPolicy
    from router.providers.native import NativeOpenAIProvider

    base, model, reads_lambda, price = parse_llm_spec(spec)
    # The router calls the table's models by tool name: two models of one name could not
    # both be called (refused as the gateway refuses such a pool).
    check_tool_names(sorted({m for r in (*ctx.train, *ctx.validation) for m in r.outcomes}))
    if price is None:
        # A router model the catalog knows (a hosted model used as the router) costs what the
        # gateway would charge for it; a self-hosted one is free unless the spec prices it.
        price = load_default_catalog().get(model)
    if price is None:
        logger.warning(
            "%s: the router model %r has no price; its own tokens count as free "
            "(add #price=IN/OUT to the spec)",
            mask_userinfo(spec),
            model,
        )
        price = ModelPrice.free()
    router_model = dataclasses.replace(
        replay_model("router", price),
        upstream_model=model,
        api_base=base,
        timeout_s=120,
        max_concurrency=64,
        max_retries=1,
    )

    class OwningLLMRouterPolicy(LLMRouterPolicy):
        # The gateway shares one provider between policies and closes it on shutdown; here
        # each swept λ builds a policy with its own HTTP session, closed with the policy.
        async def aclose(self) -> None:
            await self.provider.aclose()

    return LoopRouter(
        mask_userinfo(spec),  # the router's name, in the report and metrics.json
        lambda pool: OwningLLMRouterPolicy(
            NativeOpenAIProvider(), router_model, cost_weight_in_prompt=reads_lambda
        ),
    )


def _checkpoint_path(spec: str) -> str | None:
    """``spec`` as a checkpoint path if it names one (its directory, its
    ``checkpoint.json``, a single-file ``.safetensors`` checkpoint, or the run directory
    holding it: ``router.checkpoint.checkpoint_location``)."""
    from router.checkpoint import META_FILE, checkpoint_location

    p = checkpoint_location(spec)
    if (p.is_dir() and (p / META_FILE).is_file()) or (p.is_file() and p.suffix == ".safetensors"):
        return str(p)
    return None


def _bare(spec: str, ctx: LoadContext) -> LoopRouter | None:
    """Specs without a prefix: a checkpoint path or ``packaged:<name>`` (as ``compact:``),
    and the gateway's policy names as a client would put them in ``model``
    (``compact``: the default checkpoint; ``cheapest``; ``fixed:<model>``), with or without
    the ``xrouter/`` of DESIGN's model names (``xrouter/cascade`` and ``xrouter/random`` are
    the gateway's policies, not the eval's baselines of those names; ``xrouter`` alone is the
    default configuration's default policy, ``compact``)."""
    from router.checkpoint import PACKAGED_PREFIX, default_checkpoint_path

    if spec == "xrouter":
        spec = "compact"
    elif spec.startswith("xrouter/"):
        spec = spec.removeprefix("xrouter/")
        if spec in ("cascade", "random"):
            return _policy(f"policy:{spec}", ctx)
    if spec.startswith(PACKAGED_PREFIX):
        return _compact(f"compact:{spec}", ctx)
    if spec == "compact":
        return _compact(f"compact:{default_checkpoint_path()}", ctx)
    if spec == "cheapest" or spec.startswith("fixed:"):
        return _policy(f"policy:{spec}", ctx)
    if spec == "llm":
        raise ValueError(f"the llm router is evaluated over HTTP: --policy {LLM_SPEC}")
    path = _checkpoint_path(spec)
    return None if path is None else _compact(f"compact:{path}", ctx)


def loop_loaders() -> dict[str, RouterLoader]:
    # "" is tried last, for specs no prefix (nor baseline name) claims.
    return {"compact:": _compact, "policy:": _policy, "llm:": _llm, "": _bare}
