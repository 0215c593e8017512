"""The reconstruct-gaussians recipe end to end on CPU: PSNR rises on lego_tiny, resume after densification,
export, learning-rate scaling, and the ``lift3d reconstruct`` front-end."""

import csv
import json
import shutil

import pytest
import torch

from lift3d import recipes
from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from lift3d.config import load_config
from lift3d.gaussians.formats.ply import load_ply
from lift3d.method_table import find_method, stage_recipes
from lift3d.recipes import recipe_config
from lift3d.runs.runner import run_experiment
from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem, _scale_schedule

QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false"]
SMALL = ["system.gaussians.init_points=2000", "system.renderer.tile_size=4", "system.gaussians.sh_degree=1",
         "system.gaussians.sh_degree_interval=50"]


def test_lego_tiny_psnr_rises_well_above_its_start(tmp_path, data_dir, capsys):
    code = main(["reconstruct", str(data_dir / "lego_tiny"), f"output_root={tmp_path}", *QUIET, *SMALL,
                 "data.val_split=train", "data.n_orbit_views=4", "trainer.max_steps=150", "trainer.val_check_interval=150",
                 "trainer.num_sanity_val_steps=1", "checkpoint.every_n_train_steps=0", "system.densify.refine_start=40",
                 "system.densify.refine_every=40", "system.densify.refine_stop=130", "system.densify.reset_every=0"])
    assert code == 0
    run_dir = tmp_path / "reconstruct-gaussians" / "lego_tiny"
    record = json.loads((run_dir / "save" / "metrics.json").read_text())
    start, end = record["history"][0], record["val"]
    assert start["step"] == 0 and end["step"] == 150
    assert end["psnr"] > start["psnr"] + 10.0 and end["psnr"] > 22.0, record["history"]
    ply = load_ply(run_dir / "save" / "it150-gaussians.ply")
    assert len(ply["means"]) > 2000  # densification grew the cloud
    assert (run_dir / "save" / "it150-test.mp4").stat().st_size > 0
    out = capsys.readouterr().out
    assert f"val PSNR {end['psnr']:.2f} dB" in out and "it150-gaussians.ply" in out


def _losses(run_dir):
    with open(run_dir / "csv_logs" / "metrics.csv") as handle:
        return {int(r["step"]): float(r["train/loss_l1"]) for r in csv.DictReader(handle) if r.get("train/loss_l1")}


def test_resume_after_the_gaussian_count_changed(tmp_path, data_dir):
    config = recipe_config("reconstruct-gaussians")
    overrides = [f"output_root={tmp_path}", f"data.root={data_dir / 'lego_tiny'}", "data.val_split=train", *QUIET, *SMALL,
                 "trainer.max_steps=40", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
                 "trainer.log_every_n_steps=1", "checkpoint.every_n_train_steps=20", "system.densify.refine_start=5",
                 "system.densify.refine_every=10", "system.densify.reset_every=0", "system.export.formats=[]"]
    full = run_experiment("train", load_config(config, overrides=overrides + ["tag=full"]), [config], [])
    middle = tmp_path / "step20.ckpt"
    shutil.copyfile(full / "ckpts" / "step0000020.ckpt", middle)
    at_20 = load_checkpoint(middle)
    assert at_20["state_dict"]["gaussians.means"].shape[0] != 2000  # densified before the checkpoint
    # resumed with the photos resident on the training device (as on CUDA): the same batches, step for step
    resumed = run_experiment("train", load_config(config, overrides=overrides + [
        "tag=resumed", f"resume={middle}", "data.images_on_device=always"]), [config], [])
    a, b = load_checkpoint(full / "ckpts" / "last.ckpt"), load_checkpoint(resumed / "ckpts" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 40
    for key, value in a["state_dict"].items():
        assert value.shape == b["state_dict"][key].shape, key
        assert torch.allclose(value, b["state_dict"][key], atol=1e-5), key
    assert a["state_dict"]["gaussians.means"].shape != at_20["state_dict"]["gaussians.means"].shape  # changed again later
    la, lb = _losses(full), _losses(resumed)
    assert [s for s in lb if s >= 20] and all(la[s] == pytest.approx(lb[s], rel=1e-5) for s in lb if s >= 20)
    # the optimizer state follows the count (Adam moments per Gaussian)
    moments = [v["exp_avg"].shape[0] for v in b["optimizer_states"][0]["state"].values()]
    assert set(moments) == {b["state_dict"]["gaussians.means"].shape[0]}

    code = main(["export", str(config), f"--resume={resumed / 'ckpts' / 'last.ckpt'}", f"output_root={tmp_path}",
                 f"data.root={data_dir / 'lego_tiny'}", *SMALL])
    assert code == 0
    exported = load_ply(resumed / "save" / "it40-gaussians.ply")
    assert torch.equal(exported["means"], b["state_dict"]["gaussians.means"])


def test_position_learning_rate_scales_with_the_scene_extent():
    assert _scale_schedule(0.5, 2.0) == 1.0
    assert _scale_schedule([0, 1.6e-4, 1.6e-6, 30000, "log"], 2.0) == [0, 3.2e-4, 3.2e-6, 30000, "log"]
    assert _scale_schedule([[0, 1.0], [10, 0.5]], 3.0) == [[0, 3.0], [10, 1.5]]
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=["system.scene_extent=2.5"])
    system = ReconstructGaussiansSystem(cfg.system)
    system.gaussians.initialize(torch.randn(10, 3))
    optimizer = system.configure_optimizers()
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert groups["gaussians.means"]["lr"] == pytest.approx(1.6e-4 * 2.5)
    assert groups["gaussians.means"]["lr_schedule"][2] == pytest.approx(1.6e-6 * 2.5)
    assert groups["gaussians.opacity_logits"]["lr"] == pytest.approx(0.05)  # not scaled
    assert optimizer.defaults["eps"] == 1e-15


def test_reconstruct_with_no_path_uses_the_sample_scene(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["reconstruct", "trainer.max_steps=20", "trainer.val_check_interval=20", "data.n_orbit_views=3",
                 "trainer.enable_progress_bar=false"])
    captured = capsys.readouterr()
    assert code == 0
    assert "reconstructing the built-in sample scene" in captured.err and "val PSNR" in captured.out
    runs = list((tmp_path / "outputs" / "reconstruct-gaussians-sample").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("sample_scene@")
    assert (runs[0] / "save" / "it20-gaussians.ply").is_file() and (runs[0] / "save" / "it20-test.mp4").is_file()


def test_reconstruct_errors(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "configs"
    empty.mkdir()
    shutil.copy(recipe_config("reconstruct-gaussians"), empty)
    monkeypatch.setattr(recipes, "CONFIG_DIR", empty)
    with pytest.raises(FileNotFoundError, match="no recipe 'reconstruct-nerf'"):
        recipe_config(stage_recipes(find_method("nerf"), sample=False)[0])
    monkeypatch.undo()
    assert main(["reconstruct", str(tmp_path)]) == 2
    assert "holds no poses lift3d can read" in capsys.readouterr().err
