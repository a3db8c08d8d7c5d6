"""The training command is composed against verl's own ``ppo_trainer`` config: Hydra
refuses keys verl does not have, so the script ``xrouter verl-data`` writes stays valid."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from training.verl.launch import GrpoRun, grpo_overrides

CONFIG_DIR = Path(verl.__file__).parent / "trainer" / "config"


def composed(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def test_the_overrides_are_valid_verl_config(tmp_path: Path) -> None:
    cfg = composed(grpo_overrides(tmp_path, GrpoRun(group_size=4, gpus_per_node=2)))
    rollout = cfg.actor_rollout_ref.rollout
    assert cfg.algorithm.adv_estimator == "grpo" and rollout.n == 4
    assert rollout.multi_turn.enable and rollout.multi_turn.format == "hermes"
    # Rollouts run the gateway's loop, registered from the dataset directory.
    assert rollout.agent.agent_loop_config_path == str(tmp_path / "agent_loops.yaml")
    assert rollout.agent.default_agent_loop == "xrouter"
    assert cfg.algorithm.filter_groups.enable and cfg.algorithm.filter_groups.metric == "reward"
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert cfg.trainer.n_gpus_per_node == 2
    assert cfg.data.train_files == str(tmp_path / "train.parquet")


def test_a_key_verl_does_not_have_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="Could not override"):
        composed([*grpo_overrides(tmp_path), "actor_rollout_ref.rollout.multi_turn.tools=x"])


def test_the_written_script_runs_main_ppo_with_the_overrides(verl_dir: Path) -> None:
    script = (verl_dir / "train_grpo.sh").read_text()
    words = shlex.split(script.split("exec ", 1)[1].replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    assert words[3:-1] == grpo_overrides(verl_dir.resolve()) and words[-1] == "$@"


def test_grpo_needs_a_group() -> None:
    with pytest.raises(ValueError, match="two rollouts"):
        GrpoRun(group_size=1)
