"""The verl command that trains the router model on a dataset from ``training.verl.data``.

One function builds the Hydra overrides for ``python -m verl.trainer.main_ppo``; the
dataset directory gets them as ``train_grpo.sh``, and a test composes them against verl's
own ``ppo_trainer`` config, so a key verl renamed fails in CI rather than on a GPU node.

The defaults are the xRouter paper's recipe on verl: GRPO advantages over a group of
rollouts per prompt, with DAPO's decoupled clip (a higher upper clip ratio) and dynamic
sampling (groups whose rollouts all earn the same reward carry no gradient and are
refilled), token-mean loss, no KL term; rollouts through the gateway's own loop
(``training.verl.agent_loop``) with Hermes tool calling, which also computes the reward
(``training.verl.reward``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class GrpoRun:
    model: str = "Qwen/Qwen2.5-7B-Instruct"  # the paper's base family; any Hermes-format model
    gpus_per_node: int = 8
    nodes: int = 1
    group_size: int = 8  # rollouts per prompt (GRPO's group)
    batch_size: int = 64  # prompts per step
    mini_batch_size: int = 16
    lr: float = 1e-6
    epochs: int = 10
    max_turns: int = 4  # the gateway's default router.max_turns
    # The router's prompt includes every model's tool schema (about 150 tokens each).
    max_prompt_length: int = 6144
    max_response_length: int = 4096
    tensor_parallel: int = 2
    clip_low: float = 0.2
    clip_high: float = 0.28  # DAPO's clip-higher
    dynamic_sampling: bool = True  # DAPO's filter of groups with no reward variance
    experiment: str = "xrouter-router"

    def __post_init__(self) -> None:
        if min(self.gpus_per_node, self.nodes, self.group_size, self.batch_size) < 1:
            raise ValueError("gpus, nodes, group size and batch size must be positive")
        if self.group_size < 2:
            raise ValueError("GRPO needs at least two rollouts per prompt")


def grpo_overrides(data_dir: Path, run: GrpoRun | None = None) -> list[str]:
    r = run or GrpoRun()
    d = data_dir
    multi_turn = "actor_rollout_ref.rollout.multi_turn"
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"algorithm.filter_groups.enable={r.dynamic_sampling}",
        "algorithm.filter_groups.metric=reward",
        f"data.train_files={d / 'train.parquet'}",
        f"data.val_files={d / 'validation.parquet'}",
        f"data.train_batch_size={r.batch_size}",
        f"data.max_prompt_length={r.max_prompt_length}",
        f"data.max_response_length={r.max_response_length}",
        "data.filter_overlong_prompts=True",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={r.model}",
        f"actor_rollout_ref.actor.optim.lr={r.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={r.mini_batch_size}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=False",
        f"actor_rollout_ref.actor.clip_ratio_low={r.clip_low}",
        f"actor_rollout_ref.actor.clip_ratio_high={r.clip_high}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={r.group_size}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={r.tensor_parallel}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        f"{multi_turn}.enable=True",
        f"{multi_turn}.format=hermes",
        # The gateway's loop as the rollout (training.verl.agent_loop); it sets each
        # trajectory's reward itself, so no reward function is configured.
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={d / 'agent_loops.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=xrouter",
        "trainer.project_name=xrouter",
        f"trainer.experiment_name={r.experiment}",
        "trainer.logger=[console]",
        f"trainer.n_gpus_per_node={r.gpus_per_node}",
        f"trainer.nnodes={r.nodes}",
        f"trainer.total_epochs={r.epochs}",
        "trainer.save_freq=20",
        "trainer.test_freq=10",
    ]


def grpo_script(data_dir: Path, run: GrpoRun | None = None) -> str:
    """A shell script that runs the training on a GPU node with ``xrouter[gpu]`` installed
    (the dataset directory must be at the same path there, or rewrite it)."""
    lines = " \\\n    ".join(shlex.quote(o) for o in grpo_overrides(data_dir, run))
    return (
        "#!/bin/sh\n"
        "# GRPO/DAPO training of the LLM router on verl (GPUs; pip install 'xrouter[gpu]').\n"
        "# Written by xrouter verl-data; see training/verl/README.md.\n"
        "set -eu\n"
        f'exec python -m verl.trainer.main_ppo \\\n    {lines} \\\n    "$@"\n'
    )
