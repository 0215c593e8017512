"""The memory a Gaussian run needs per GPU (lift3d.systems.gaussian_memory), checked before training: a layout that does
not fit stops with one line naming the ways out (more GPUs with the Gaussians sharded, a Gaussian budget, a lower
resolution) instead of an out-of-memory traceback mid-run."""

from __future__ import annotations

import pytest

from lift3d.cli import main
from lift3d.config import ConfigError
from lift3d.systems import shards
from lift3d.systems.gaussian_memory import GIB, check_fits, estimate, fitting_count, parameter_floats
from tests.conftest import TEST_CONFIGS

SAMPLE_SCENE = TEST_CONFIGS.parents[1] / "lift3d" / "assets" / "sample_scene"


def test_the_estimate_counts_parameters_adam_and_renders_and_a_shard_holds_its_share():
    assert parameter_floats(3) == 59 and parameter_floats(0) == 14  # 3DGS's 59 floats a Gaussian at SH degree 3
    whole = estimate(4_000_000, 3, 1, 1600, 1600)
    assert whole.parameters == 2 * 59 * 4 * 4_000_000  # values and gradients
    assert whole.optimizer > whole.parameters  # Adam's two moments and the statistics
    assert whole.renders > 1600 * 1600 * 100  # the image, its loss and their gradients
    shard = estimate(4_000_000, 3, 1, 1600, 1600, ranks=4, sharded=True)
    assert shard.gaussians == 1_000_000 and shard.total < whole.total
    assert shard.parameters == whole.parameters // 4 and shard.optimizer == whole.optimizer // 4  # a quarter each
    assert shard.renders > whole.renders  # but it projects into every rank's views and receives what its own see
    assert estimate(4_000_000, 3, 1, 1600, 1600, ranks=4).total == whole.total  # replicated: a whole copy on each


def test_a_model_too_large_for_the_gpu_is_refused_in_one_line_naming_the_ways_out():
    need = estimate(20_000_000, 3, 1, 1920, 1080)
    budget = 16 * GIB
    assert need.total > budget
    check_fits(need, None, "cuda:0", 1, False, 3, "system.densify.max_gaussians", 20_000_000)  # nothing to check
    check_fits(estimate(100_000, 3, 1, 1920, 1080), budget, "cuda:0", 1, False, 3, "system.densify.max_gaussians", 100_000)
    with pytest.raises(ConfigError) as refused:
        check_fits(need, budget, "cuda:0", 1, False, 3, "system.densify.max_gaussians", 20_000_000)
    message = str(refused.value)
    assert "\n" not in message and "cuda:0" in message and "16.0 GiB free" in message and "20.0M Gaussians" in message
    gpus = int(message.split("Train on ")[1].split(" GPUs")[0])  # the fewest over which a shard fits the budget
    assert f"--gpus {','.join(map(str, range(gpus)))} system.shard_gaussians=true" in message and "data.downscale=2" in message
    assert estimate(20_000_000, 3, 1, 1920, 1080, gpus, sharded=True).total <= budget
    assert estimate(20_000_000, 3, 1, 1920, 1080, gpus - 1, sharded=True).total > budget or gpus == 2
    cap = int(message.split("system.densify.max_gaussians=")[1].split(")")[0])
    assert 1000 <= cap < 20_000_000 and estimate(cap, 3, 1, 1920, 1080).total <= budget  # the cap it names fits
    assert estimate(cap + 1_000_000, 3, 1, 1920, 1080).total > budget  # and is not far below what fits


def test_on_several_gpus_the_message_names_the_layout_and_the_fewest_gpus_a_shard_fits():
    need = estimate(60_000_000, 3, 1, 1920, 1080, ranks=2, sharded=True)
    with pytest.raises(ConfigError) as refused:
        check_fits(need, 40 * GIB, "cuda:1", 2, True, 3, "system.densify.max_gaussians", 60_000_000)
    message = str(refused.value)
    gpus = int(message.split("Train on ")[1].split(" GPUs")[0])
    assert "a shard of 60.0M on each of 2 GPUs" in message and gpus > 2
    assert f"--gpus {','.join(map(str, range(gpus)))} system.shard_gaussians=true" in message
    assert estimate(60_000_000, 3, 1, 1920, 1080, gpus, sharded=True).total <= 40 * GIB
    assert estimate(60_000_000, 3, 1, 1920, 1080, gpus - 1, sharded=True).total > 40 * GIB
    cap = int(message.split("system.densify.max_gaussians=")[1].split(")")[0])
    assert cap <= fitting_count(3, 1, 1920, 1080, 40 * GIB, 2, True) and cap < 60_000_000
    assert estimate(cap, 3, 1, 1920, 1080, 2, sharded=True).total <= 40 * GIB  # the cap it names (all ranks) fits


def test_a_copy_too_large_for_each_gpu_is_told_to_shard_over_the_gpus_it_has():
    """Replicated on 4 GPUs, a copy does not fit but a quarter does: the message names sharding on these 4, not more."""
    need = estimate(6_000_000, 3, 1, 400, 400, ranks=4)
    budget = estimate(6_000_000, 3, 1, 400, 400, ranks=4, sharded=True).total + GIB // 4
    assert need.total > budget
    with pytest.raises(ConfigError) as refused:
        check_fits(need, budget, "cuda:0", 4, False, 3, "system.densify.max_gaussians", 6_000_000)
    message = str(refused.value)
    assert "Shard the Gaussians over these 4 GPUs (system.shard_gaussians=true)" in message and "--gpus" not in message


def test_with_no_gpu_count_that_fits_only_the_cap_and_the_resolution_are_offered():
    """Each rank receives what its views see, so some models fit no count of GPUs: no sharding is suggested then."""
    tiny_budget = estimate(1000, 3, 1, 1920, 1080).total
    with pytest.raises(ConfigError) as refused:
        check_fits(estimate(50_000_000, 3, 1, 1920, 1080), tiny_budget, "cuda:0", 1, False, 3,
                   "system.densify.max_gaussians", 50_000_000)
    message = str(refused.value)
    assert "shard_gaussians" not in message and "Cap the Gaussians (system.densify.max_gaussians=" in message


def test_a_training_run_that_would_not_fit_stops_before_its_first_step_with_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shards.ShardedGaussians, "memory_budget", lambda self, device: 100_000)  # 100 kB "free"
    code = main(["train", str(TEST_CONFIGS / "reconstruct-gaussians-ddp.yaml"), "trainer.accelerator=cpu",
                 "trainer.devices=1", f"output_root={tmp_path}", f"system.dump_dir={tmp_path / 'dump'}",
                 f"data.root={SAMPLE_SCENE}", "trainer.max_steps=2"])
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    line = next(line for line in err.splitlines() if "the model needs about" in line)
    assert "system.densify.max_gaussians=" in line and "data.downscale" in line  # 100 kB: no GPU count would do
    assert "Traceback" not in err and not (tmp_path / "dump").exists()  # no step was trained
