"""Where a run's processes come from (lift3d.runs.world): --gpus (ids or all), --nodes, and torchrun's environment."""

from __future__ import annotations

import argparse

import pytest

from lift3d.commands.common import load_experiment, parse_gpus
from lift3d.config import ConfigError, load_config
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_trainer
from lift3d.runs.world import launch_layout, rank_line, training_processes
from lift3d.systems.replicas import ReplicatedDDPStrategy

TORCHRUN = ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK")


@pytest.fixture
def plain_env(monkeypatch):
    for key in TORCHRUN:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def _trainer_config(*overrides: str):
    return load_config(recipe_config("reconstruct-gaussians-sample"), overrides=["trainer.accelerator=cpu", *overrides])


def test_devices_times_nodes_make_the_processes_and_torchrun_decides_when_it_started_them(plain_env):
    cfg = _trainer_config("trainer.devices=2", "trainer.num_nodes=3")
    assert launch_layout(cfg.trainer) == (2, 3) and training_processes(cfg.trainer) == 6
    assert launch_layout(cfg.trainer, devices=1) == (1, 1)  # an evaluation trainer: this process alone
    plain_env.setenv("TORCHELASTIC_RUN_ID", "job")
    plain_env.setenv("WORLD_SIZE", "4")
    plain_env.setenv("LOCAL_WORLD_SIZE", "2")
    one = _trainer_config()
    assert launch_layout(one.trainer) == (2, 2) and training_processes(one.trainer) == 4
    with pytest.raises(ConfigError, match="--nodes 3 .* torchrun runs 2 machine"):
        launch_layout(cfg.trainer)
    plain_env.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match="same --nproc-per-node on every machine"):
        launch_layout(one.trainer)


def test_several_nodes_build_a_trainer_of_several_processes(plain_env, tmp_path):
    cfg = _trainer_config("trainer.num_nodes=2", f"output_root={tmp_path}")
    trainer = build_trainer(cfg, tmp_path / "run", train=True)
    assert trainer.num_nodes == 2 and isinstance(trainer.strategy, ReplicatedDDPStrategy)
    assert "rank 3 of 4 on " in rank_line(3, 4, 1, 1, "cuda:1") and rank_line(3, 4, 1, 1, "cuda:1").endswith("cuda:1")


def test_gpus_all_and_nodes_become_config_overrides(plain_env):
    with pytest.raises(ConfigError, match="--gpus all: torch sees no CUDA GPU here"):
        parse_gpus("all")
    assert parse_gpus("0, 1") == [0, 1]
    args = argparse.Namespace(config=["reconstruct-gaussians-sample"], resume=None, gpus=None, nodes=2, command="train")
    cfg, _, overrides = load_experiment(args)
    assert cfg.trainer.num_nodes == 2 and "trainer.num_nodes=2" in overrides
    with pytest.raises(ConfigError, match="--nodes takes the number of machines"):
        load_experiment(argparse.Namespace(**{**vars(args), "nodes": 0}))
