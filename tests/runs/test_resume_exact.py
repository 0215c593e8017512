"""``--resume`` is exact: a run stopped at a checkpoint and resumed ends with the parameters of the run never stopped,
bit for bit, also when it passes Lightning epoch rollovers after the resume (short epochs here; a real run is one
epoch, and its data loader used to replay the first steps of a resumed run once the epoch count rolled over)."""

from __future__ import annotations

import shutil

import pytest
import torch

import lift3d.data.base
from lift3d.checkpoints import load_checkpoint
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.runs.runner import run_experiment
from tests.conftest import TEST_CONFIGS

QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false", "trainer.run_test_after_fit=false"]


def _assert_same_final_parameters(full, resumed) -> None:
    a = load_checkpoint(full / "ckpts" / "last.ckpt")
    b = load_checkpoint(resumed / "ckpts" / "last.ckpt")
    assert a["global_step"] == b["global_step"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key


def _stop_and_resume(tmp_path, config, overrides, at: list[int]) -> None:
    full = run_experiment("train", load_config(config, overrides=[*overrides, "tag=full"]), [config], [])
    for step in at:
        middle = tmp_path / f"at{step}.ckpt"  # outside the run: the resumed run gets a folder of its own
        shutil.copyfile(full / "ckpts" / f"step{step:07d}.ckpt", middle)
        resumed = run_experiment("train", load_config(config, overrides=[*overrides, f"tag=from{step}", f"resume={middle}"]),
                                 [config], [])
        _assert_same_final_parameters(full, resumed)


@pytest.mark.parametrize("epoch_steps", [7, 10, None])
def test_fit_image_resumed_mid_epoch_equals_the_uninterrupted_run(tmp_path, monkeypatch, epoch_steps):
    monkeypatch.setattr(lift3d.data.base, "EPOCH_STEPS", epoch_steps)
    config = TEST_CONFIGS / "fit-image.yaml"  # its loss draws dropout from the global RNG: the RNG state must resume too
    overrides = [f"output_root={tmp_path}", *QUIET, "trainer.max_steps=60", "trainer.val_check_interval=25",
                 "checkpoint.every_n_train_steps=10"]
    # from 10 with 7-step epochs: rollovers at 14, 21, ...; 10-step epochs: checkpoints at epoch ends (a new epoch's
    # loader must not draw from the global RNG); one epoch: the old loader rolled over at step 50 and replayed
    _stop_and_resume(tmp_path, config, overrides, at=[10, 20] if epoch_steps is None else [10, 30])


def test_gaussians_with_densification_resume_exactly_past_two_rollovers(tmp_path, monkeypatch, data_dir):
    monkeypatch.setattr(lift3d.data.base, "EPOCH_STEPS", 8)
    config = recipe_config("reconstruct-gaussians")
    overrides = [f"output_root={tmp_path}", f"data.root={data_dir / 'lego_tiny'}", "data.val_split=train", *QUIET,
                 "system.gaussians.init_points=500", "system.renderer.tile_size=4", "system.gaussians.sh_degree=1",
                 "system.gaussians.sh_degree_interval=10", "trainer.max_steps=30", "trainer.val_check_interval=0",
                 "checkpoint.every_n_train_steps=10", "system.densify.refine_start=4", "system.densify.refine_every=6",
                 "system.densify.reset_every=0", "system.export.formats=[]"]
    _stop_and_resume(tmp_path, config, overrides, at=[10])  # rollovers at 16 and 24, densification at 10, 16, 22, 28
    final = load_checkpoint(tmp_path / "reconstruct-gaussians" / "full" / "ckpts" / "last.ckpt")
    assert final["state_dict"]["gaussians.means"].shape[0] != 500  # densification changed the count
