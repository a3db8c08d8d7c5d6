"""Where a chat request goes: the policy its ``model`` names (or a pool model, passed
through), the models it may use — its key's, its own ``xrouter.models``, those that can read
its input, those whose circuit is closed — and the context the routing loop runs in."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from gateway.echo import echo
from gateway.errors import APIError, bad_request, forbidden, not_found
from gateway.principal import FIXED_PREFIX, Principal
from gateway.runtime import POLICY_PREFIX, ROUTER_MODEL, Runtime
from gateway.schemas import ChatCompletionRequest
from pricing import usd_to_micros
from router.context_window import fits, likely_prompt_tokens, tokens_needed
from router.estimate import requested_max_tokens
from router.modalities import request_modalities, requested_outputs
from router.policies.baselines import FixedPolicy
from router.policy import Policy, RouteContext

# Fields that shape routing or the gateway's response, never forwarded as model parameters;
# and ``store``/``metadata``, which would have the provider keep the conversation in the
# operator's account (nothing is stored here, as the Responses API says with store: false).
_NOT_PARAMS = frozenset(
    {"model", "messages", "tools", "stream", "stream_options", "usage", "xrouter", "store",
     "metadata"}
)  # fmt: skip


class PassThrough(FixedPolicy):
    """``model: <pool model>``: call exactly that model (with its configured fallbacks),
    reported as the ``passthrough`` policy."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.name = "passthrough"


@dataclass(slots=True)
class Resolved:
    policy: Policy
    policy_name: str
    passthrough: bool
    # The one model a pass-through or a fixed:<model> policy calls; None for the routers.
    pinned: str | None = None


def resolve(rt: Runtime, req: ChatCompletionRequest, who: Principal) -> Resolved:
    name = req.model
    if name == ROUTER_MODEL or name.startswith(POLICY_PREFIX):
        default = who.default_policy or rt.default_policy
        policy_name = default if name == ROUTER_MODEL else name[len(POLICY_PREFIX) :]
        policy = rt.policy(policy_name)
        if policy is None:
            raise not_found(
                f"unknown router policy {echo(policy_name)}; "
                f"available: {', '.join(rt.policy_names)}"
            )
        if who.allowed_policies is not None and policy_name not in who.allowed_policies:
            raise forbidden(
                f"this key may not use policy {echo(policy_name)}", "policy_not_allowed"
            )
        if not who.may_use_policy(policy_name):
            # fixed:<model>, allowed as a policy, names a model the key may not use.
            model = policy_name[len(FIXED_PREFIX) :]
            raise forbidden(f"this key may not use model {echo(model)}", "model_not_allowed")
        pinned = policy.model if isinstance(policy, FixedPolicy) else None
        return Resolved(policy, policy_name, passthrough=False, pinned=pinned)
    if name not in rt.pool:
        raise not_found(
            f"the model {echo(name)} does not exist; GET /v1/models lists the available ones"
        )
    if not who.may_use_model(name):
        raise forbidden(f"this key may not use model {echo(name)}", "model_not_allowed")
    return Resolved(PassThrough(name), "passthrough", passthrough=True, pinned=name)


def route_pool(
    rt: Runtime,
    req: ChatCompletionRequest,
    who: Principal,
    resolved: Resolved,
    data: dict[str, Any],
) -> list[str]:
    """The pool models ``data`` (the decoded request) may be routed to. A pass-through's,
    and a fixed:<model> policy's, are its model and the model's configured fallbacks, each
    held to the same limits."""
    if resolved.pinned is not None:
        model = resolved.pinned
        names = _allowed(rt, req, who, [model, *rt.pool[model].fallbacks])
        if model not in names:
            raise forbidden(
                f"xrouter.models leaves out the model the request names ({echo(model)})",
                "no_allowed_models",
                "xrouter.models",
            )
        # The named model must take the request itself (else the 400 says why); a fallback
        # that cannot is left out, as the chain leaves out the ones the request may not use.
        _capable(rt, [model], data)
        return [model, *(n for n in _capable_or_none(rt, names[1:], data) if n != model)]
    names = _allowed(rt, req, who, rt.pool.names)
    if not names:
        raise forbidden(
            "no pool model is allowed for this request", "no_allowed_models", "xrouter.models"
        )
    names = _capable(rt, names, data)
    # Policies choose among models whose circuit is not open (router.health). If every one
    # is open, leave them all: the calls fail fast and the client gets a 503 at once.
    return rt.client.breakers.available(names) or names


def _allowed(
    rt: Runtime, req: ChatCompletionRequest, who: Principal, names: list[str]
) -> list[str]:
    """``names`` less the pool models the key may not use and, with ``xrouter.models``,
    the ones it leaves out (a name it gives that is no pool model is a 400)."""
    names = [n for n in names if n in rt.pool and who.may_use_model(n)]
    if req.xrouter and req.xrouter.models:
        unknown = [m for m in req.xrouter.models if m not in rt.pool]
        if unknown:
            raise bad_request(
                f"xrouter.models names unknown models: {echo(unknown)}", param="xrouter.models"
            )
        names = [n for n in names if n in req.xrouter.models]
    return names


def _capable_or_none(rt: Runtime, names: list[str], data: dict[str, Any]) -> list[str]:
    try:
        return _capable(rt, names, data) if names else []
    except APIError:
        return []


def _capable(rt: Runtime, names: list[str], data: dict[str, Any]) -> list[str]:
    """``names`` without the models that cannot read the request's input (images, audio),
    cannot answer in the output it asks for (audio), or whose context window it does not
    fit in."""
    names = _writers(rt, _readers(rt, names, data["messages"]), data.get("modalities"))
    return _long_enough(rt, names, data)


def _long_enough(rt: Runtime, names: list[str], data: dict[str, Any]) -> list[str]:
    if all(rt.pool[n].context_window is None for n in names):
        return names
    prompt = likely_prompt_tokens(data["messages"], data.get("tools"))
    asked = requested_max_tokens(data)
    fitting = [n for n in names if fits(rt.pool[n], prompt, asked)]
    if not fitting:
        windows = [w for n in names if (w := rt.pool[n].context_window) is not None]
        who = (
            f"model {names[0]!r} takes" if len(names) == 1 else "the largest model it may use takes"
        )
        need = min(tokens_needed(rt.pool[n], prompt, asked) for n in names)
        raise bad_request(
            f"the request needs about {need} tokens (its messages, tools and the output it "
            f"asks for), and {who} {max(windows)} (context_window of the pool models)",
            param="messages",
            code="context_length_exceeded",
        )
    return fitting


def _readers(rt: Runtime, names: list[str], messages: list[dict[str, Any]]) -> list[str]:
    needed = request_modalities(messages)
    return _only_able(
        names,
        needed,
        lambda n: rt.pool[n].accepts(needed),
        lambda kinds, who: bad_request(
            f"the request carries {kinds} input, which {who} accept (input_modalities of the "
            "pool models)",
            param="messages",
            code="unsupported_input",
        ),
    )


def _writers(rt: Runtime, names: list[str], modalities: Any) -> list[str]:
    needed = requested_outputs(modalities)  # validated by the request schema
    return _only_able(
        names,
        needed,
        lambda n: rt.pool[n].produces(needed),
        lambda kinds, who: bad_request(
            f"the request asks for {kinds} output (modalities), which {who} give "
            "(output_modalities of the pool models)",
            param="modalities",
            code="unsupported_output",
        ),
    )


def _only_able(
    names: list[str],
    needed: AbstractSet[str],
    able: Callable[[str], bool],
    refusal: Callable[[str, str], APIError],
) -> list[str]:
    """``names`` without the models ``able`` says cannot handle ``needed`` (text is always
    handled); when none is left, ``refusal(kinds, who)`` — the kinds beyond text, and who
    cannot — is raised."""
    if needed == {"text"}:
        return names
    capable = [n for n in names if able(n)]
    if not capable:
        kinds = " and ".join(sorted(needed - {"text"}))
        who = f"model {names[0]!r} does not" if len(names) == 1 else "no model it may use does"
        raise refusal(kinds, who)
    return capable


def _max_turns(rt: Runtime, resolved: Resolved) -> int:
    if resolved.passthrough:
        return 1
    if resolved.policy_name == "llm":
        return rt.settings.router.llm.max_turns
    return rt.settings.router.max_turns


def build_context(
    rt: Runtime,
    data: dict[str, Any],
    req: ChatCompletionRequest,
    who: Principal,
    resolved: Resolved,
    request_id: str,
) -> RouteContext:
    controls = req.xrouter
    pool = rt.subset(route_pool(rt, req, who, resolved, data))
    # The request's own controls, else its key's defaults, else the gateway's. A key's cap
    # is a ceiling: a request may ask for less, never more.
    cost_weight = next(
        w
        for w in (
            controls.cost_weight if controls else None,
            who.cost_weight,
            rt.settings.router.cost_weight,
        )
        if w is not None
    )
    caps = [
        usd_to_micros(controls.max_cost_usd) if controls and controls.max_cost_usd else None,
        who.max_cost_micros,
    ]
    max_cost = min((c for c in caps if c is not None), default=None)
    params = {k: v for k, v in data.items() if k not in _NOT_PARAMS}
    return RouteContext(
        request_id=request_id,
        messages=data["messages"],
        pool=pool,
        cost_weight=cost_weight,
        max_cost_micros=max_cost,
        max_turns=_max_turns(rt, resolved),
        tools=data.get("tools"),
        request_params=params,
    )
