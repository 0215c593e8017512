"""``lift3d train NAME`` from any folder, ``lift3d train --list``, and package assets named in configs
(``lift3d:sample_scene``) so a run survives reinstalling lift3d elsewhere."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lift3d.cli import main
from lift3d.commands.common import resolve_recipe
from lift3d.config import ConfigError, load_config
from lift3d.data import sample_scene
from lift3d.data.sample_scene import asset_name, resolve_asset, sample_scene_path
from lift3d.recipes import CONFIG_DIR, needs_of, recipe_names, recipe_needs
from tests.conftest import REPO

TINY_RUN = ["trainer.max_steps=4", "trainer.val_check_interval=4", "trainer.run_test_after_fit=false",
            "system.export.formats=[]", "trainer.enable_progress_bar=false", "system.gaussians.init_points=300",
            "use_timestamp=false"]


def test_list_shows_every_recipe_with_its_device_and_weights(capsys):
    assert main(["train", "--list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert set(rows) == set(recipe_names())
    assert "CUDA GPU" in rows["gaussian-sds"] and "stabilityai/stable-diffusion-2-1-base" in rows["gaussian-sds"]
    assert "CPU" in rows["gaussian-sds-analytic"] and "no weights" in rows["gaussian-sds-analytic"]
    assert "CPU or CUDA GPU" in rows["reconstruct-nerf"] and "no weights" in rows["reconstruct-nerf"]
    assert "stabilityai/TripoSR" in rows["triposr"]
    assert "zero123" in rows["magic123"] and "stable-diffusion" in rows["magic123"]  # both priors of the recipe
    assert "model folder" in rows["mvdream"]  # no public diffusers release: the user converts it


def test_needs_follow_the_parts_a_config_names():
    """The rule on configs the recipes do not have: a prior with default weights, a weight-free one, a generator."""
    zero123 = {"system": {"guidance_type": "zero123", "guidance": {}}}
    assert needs_of("my-image", zero123).weights == ("zero123's default weights",)
    assert needs_of("my-image", zero123).device == "CUDA GPU"
    assert needs_of("my-image-cpu", zero123).device == "CPU"  # a recipe made for the CPU says so by its name
    analytic = {"system": {"guidance_type": "analytic", "editor_type": "analytic-edit"}}
    assert needs_of("twin", analytic) == needs_of("twin", {})
    assert needs_of("twin", {}).weights == () and needs_of("twin", {}).device == "CPU or CUDA GPU"
    local = {"system": {"generator_type": "triposr", "generator": {"pretrained_model_name_or_path": "/models/tsr"}}}
    assert needs_of("x", local).weights == ("/models/tsr",)
    assert recipe_needs("edit-nerf-analytic").weights == ()  # its base (edit-nerf) loads InstructPix2Pix; it does not


def test_a_recipe_name_resolves_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Path(resolve_recipe("reconstruct-gaussians-sample")) == CONFIG_DIR / "reconstruct-gaussians-sample.yaml"
    (tmp_path / "reconstruct-nerf").mkdir()  # a file or folder of that name here wins: the user gave a path
    assert resolve_recipe("reconstruct-nerf") == "reconstruct-nerf"
    with pytest.raises(ConfigError, match=r"did you mean reconstruct-gaussians-sample.*lift3d train --list"):
        resolve_recipe("reconstruct-gaussians-smaple")
    with pytest.raises(ConfigError, match=r"give its name instead \(lift3d train gaussian-sds-analytic\)"):
        resolve_recipe("configs/gaussian-sds-analytic.yaml")
    assert resolve_recipe("mine.yaml") == "mine.yaml"  # the loader says "config file not found"
    assert resolve_recipe("trainer.max_steps") == "trainer.max_steps"  # the loader says overrides are key=value


def test_train_by_name_from_another_folder_records_the_asset_by_name(tmp_path):
    """The sample recipe names its scene lift3d:sample_scene; parsed.yaml keeps the name, and a copy of lift3d
    installed elsewhere loads the finished run (its validation reads the scene from the new place)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "lift3d", "train", "reconstruct-gaussians-sample", f"output_root={out}",
                           "tag=by-name", *TINY_RUN], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = out / "reconstruct-gaussians-sample" / "by-name"
    parsed = yaml.safe_load((run / "configs" / "parsed.yaml").read_text())
    assert parsed["data"]["root"] == "lift3d:sample_scene"
    assert str(sample_scene_path()) not in (run / "configs" / "parsed.yaml").read_text()
    # "reinstall": the package's assets now live elsewhere; the run's config still loads and validates
    moved = tmp_path / "site" / "assets"
    shutil.copytree(sample_scene_path(), moved / "sample_scene")
    resolved = subprocess.run([sys.executable, "-c", (
        "import sys; from lift3d.data import sample_scene as s; from pathlib import Path;"
        f"s.ASSETS = Path({str(moved)!r}); from lift3d.cli import main; sys.exit(main(['validate', {str(run)!r}]))")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert resolved.returncode == 0, resolved.stderr[-3000:]


def test_install_paths_become_asset_names_and_back(tmp_path, monkeypatch):
    from lift3d.runs.run_dirs import with_asset_names

    scene = str(sample_scene_path())
    assert asset_name(scene) == "lift3d:sample_scene"
    assert asset_name(scene + "/train") == "lift3d:sample_scene/train"
    assert asset_name(str(tmp_path)) is None and asset_name("lift3d:sample_scene") is None
    tree = {"data": {"root": scene, "image": "", "sizes": [scene, 3]}, "name": "x/y"}
    assert with_asset_names(tree) == {"data": {"root": "lift3d:sample_scene", "image": "",
                                               "sizes": ["lift3d:sample_scene", 3]}, "name": "x/y"}
    assert resolve_asset("lift3d:sample_scene") == sample_scene.ASSETS / "sample_scene"
    assert resolve_asset("~/scene") == Path.home() / "scene"
    with pytest.raises(ConfigError, match="names no asset of lift3d.*lift3d:sample_scene"):
        resolve_asset("lift3d:no_such_scene")
    with pytest.raises(ConfigError, match="names no asset"):
        resolve_asset("lift3d:../configs")


def test_an_override_may_name_the_asset():
    cfg = load_config(CONFIG_DIR / "gaussian-sds-analytic.yaml", overrides=["data.reference_scene=lift3d:sample_scene"])
    assert cfg.data["reference_scene"] == "lift3d:sample_scene"
    from lift3d.data.formats.blender import read_cameras

    assert len(read_cameras(cfg.data["reference_scene"], "train")) == sample_scene.N_TRAIN
