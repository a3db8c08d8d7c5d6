"""verl's real rollout pieces on a CPU, for tests and benchmarks: a byte-level tokenizer with
a Hermes-style chat template built here (no model download), verl's rollout config, and a
scripted router model standing in for vLLM behind verl's ``LLMServerClient`` interface."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

# A minimal Hermes-style template: tools in the system turn, <tool_call> JSON in assistant
# turns, results in <tool_response> blocks without their tool_call_id (as Qwen2.5 renders
# them). Written for these tests.
HERMES_TEMPLATE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a tool with <tool_call>{"name": <name>, "arguments": <object>}</tool_call>.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}
{%- for tc in message.tool_calls or [] %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role != 'system' %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}
""".strip()


def hermes_tokenizer() -> PreTrainedTokenizerFast:
    """Every byte is a token (no merges), so any text round-trips exactly."""
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    tok.add_tokens(["<tool_call>", "</tool_call>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=HERMES_TEMPLATE,
    )


def rollout_config(response_length: int = 8192, prompt_length: int = 8192) -> DictConfig:
    return OmegaConf.create(
        {
            "data": {},
            "actor_rollout_ref": {
                "rollout": {
                    "prompt_length": prompt_length,
                    "response_length": response_length,
                    "full_determinism": False,
                    "multi_turn": {
                        "max_user_turns": 4,
                        "max_assistant_turns": 5,
                        "max_parallel_calls": 4,
                        "max_tool_response_length": 4000,
                        "tool_response_truncate_side": "middle",
                        "format": "hermes",
                    },
                }
            },
        }
    )


Turn = str | Callable[[str], str]
# The header the router reads above each tool result (router.tools.tool_result_text).
RESULT_HEADER = re.compile(r"\[tool_call_id: (\S+) \| model: (\S+)\]")


def hermes_call(tool: str, **arguments: Any) -> str:
    """A tool call as a Hermes-format model writes it."""
    body = orjson.dumps({"name": tool, "arguments": arguments}).decode()
    return f"<tool_call>\n{body}\n</tool_call>"


def select_by_model(model: str) -> Turn:
    """A turn that selects the call that answered with ``model``, by the id its result shows
    in the prompt (as a router model must)."""

    def turn(prompt: str) -> str:
        ids = {m: i for i, m in RESULT_HEADER.findall(prompt)}
        return hermes_call("select_response", tool_call_id=ids[model])

    return turn


class ScriptedRouterModel(LLMServerClient):
    """verl's client of the rollout servers (vLLM on a GPU), answering with scripted turns —
    a text, or a function of the decoded prompt (to copy a tool call id, as a model
    would); it keeps every prompt it was sent, decoded."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast, turns: list[Turn]) -> None:
        # No load balancer: generate() below never asks for a server.
        super().__init__(rollout_config(), None)  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self.prompts: list[str] = []
        self.generated: list[list[int]] = []
        self.sampling: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        prompt = str(self.tokenizer.decode(prompt_ids))
        self.prompts.append(prompt)
        turn = self.turns.pop(0)
        text = (turn(prompt) if callable(turn) else turn) + "<|im_end|>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        self.sampling.append(dict(sampling_params))
        if sampling_params.get("max_tokens") is not None:
            ids = ids[: int(sampling_params["max_tokens"])]  # cut off, as vLLM cuts it
        self.generated.append(ids)
        return TokenOutput(token_ids=ids)


def build_agent_loop(
    verl_dir: Path,
    model: ScriptedRouterModel,
    config: DictConfig,
) -> Any:
    """The agent loop ``xrouter verl-data`` registered in ``verl_dir``, instantiated the way
    verl's agent-loop worker does it (Hydra, from the registry entry)."""
    import hydra
    import yaml
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    (entry,) = yaml.safe_load((verl_dir / "agent_loops.yaml").read_text())
    return hydra.utils.instantiate(
        config=OmegaConf.create(entry),
        trainer_config=DictConfigWrap(config=config),
        server_manager=model,
        tokenizer=model.tokenizer,
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(config.get("data") or OmegaConf.create({})),
        tools=ToolListWrap([]),
    )
