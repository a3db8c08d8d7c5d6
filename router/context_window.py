"""Which pool models a request fits in: a model that declares its context window (prompt
plus output tokens) is not routed a request too long for it, as OpenRouter leaves out
providers whose context is too short and LiteLLM's pre-call checks drop such deployments.
Sent anyway, the call would fail upstream (vLLM refuses a prompt plus ``max_tokens`` past
``max_model_len``) and cost a retry, a fallback or the client's error.

The count has no tokenizer (every model has its own): the budget estimate of
:mod:`router.estimate` counts 3 bytes of text a token, high on purpose so that holds cover
charges. Here an overcount would refuse prompts that fit, so text is counted at 4 bytes a
token, about what tokenizers average on English. A prompt the count puts just under a
window and the model's tokenizer just over fails upstream as before; one it puts over is
over for any tokenizer that averages more than 4 bytes a token.
"""

from __future__ import annotations

from typing import Any

from router.estimate import BYTES_PER_TOKEN, estimate_prompt_tokens
from router.pool import PoolModel

LIKELY_BYTES_PER_TOKEN = 4


def likely_prompt_tokens(messages: list[dict[str, Any]], tools: Any = None) -> int:
    """About how many tokens the prompt is (images and audio scaled down alike)."""
    return estimate_prompt_tokens(messages, tools=tools) * BYTES_PER_TOKEN // LIKELY_BYTES_PER_TOKEN


def tokens_needed(model: PoolModel, prompt_tokens: int, max_tokens: int | None) -> int:
    """The window a call needs: the prompt and the output it asks for (capped at the
    model's ``max_output_tokens``, as the call is sent), or one token of output."""
    output = min(max_tokens, model.max_output_tokens) if max_tokens else 1
    return prompt_tokens + output


def fits(model: PoolModel, prompt_tokens: int, max_tokens: int | None) -> bool:
    window = model.context_window
    return window is None or tokens_needed(model, prompt_tokens, max_tokens) <= window
