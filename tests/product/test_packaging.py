"""The wheel users install (``pip install .``) holds every file lift3d reads at run time: the recipe YAMLs, the sample
scene, the typing marker, and every module. CI's wheel job (.ci/wheel) installs that wheel outside the source tree
and runs the README's main job; this test finds a missing file in seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lift3d.data.sample_scene import N_TRAIN, N_VAL, sample_scene_path
from lift3d.recipes import recipe_config, recipe_names
from tests.conftest import REPO

PACKAGE = REPO / "lift3d"


def _package_files() -> list[str]:
    """Every file of the source package, as wheel entry names (``lift3d/...``), less bytecode caches."""
    return sorted(p.relative_to(REPO).as_posix() for p in PACKAGE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the package source (the build's own build/ and egg-info stay out of the
    checkout), by the PEP 517 hook a pip install calls, with the setuptools of this environment (the test extra's)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(PACKAGE, source / "lift3d", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = "import sys; from setuptools import build_meta; print(build_meta.build_wheel(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", build, str(work / "dist")], cwd=source, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return work / "dist" / done.stdout.strip().splitlines()[-1]


def test_wheel_holds_every_recipe_asset_and_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = sorted(p.relative_to(REPO).as_posix() for p in (PACKAGE / "configs").glob("*.yaml"))
    assets = sorted(p.relative_to(REPO).as_posix() for p in (PACKAGE / "assets").rglob("*") if p.is_file())
    assert len(recipes) >= 30 and "lift3d/configs/reconstruct-gaussians-sample.yaml" in recipes
    scene = [a for a in assets if a.startswith("lift3d/assets/sample_scene/")]
    assert len(scene) == 2 + N_TRAIN + N_VAL  # transforms_{train,val}.json and the photos
    assert "lift3d/assets/html/splat_viewer.js" in assets  # the html export's viewer
    assert [r for r in recipes if r not in names] == []
    assert [a for a in assets if a not in names] == []
    assert "lift3d/py.typed" in names
    assert [f for f in _package_files() if f not in names] == []
    name, version = wheel.name.split("-")[:2]
    entry_points = zipfile.ZipFile(wheel).read(f"{name}-{version}.dist-info/entry_points.txt")
    assert "lift3d = lift3d.cli:main" in entry_points.decode()


def test_the_unpacked_wheel_finds_its_own_recipes_and_sample_scene(wheel, tmp_path):
    """Imported from the unpacked wheel (first on the path, ahead of an editable install), lift3d lists every recipe
    and reads the sample scene from inside itself."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = ("import json, lift3d; from lift3d.recipes import recipe_names, recipe_config; "
             "from lift3d.data.sample_scene import sample_scene_path; "
             "print(json.dumps([lift3d.__file__, recipe_names(), str(recipe_config('reconstruct-gaussians-sample')), "
             "sorted(p.name for p in sample_scene_path().iterdir())]))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    where, names, sample_recipe, scene = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(where).is_relative_to(site)
    assert names == recipe_names() and Path(sample_recipe).is_relative_to(site)
    assert scene == ["train", "transforms_train.json", "transforms_val.json", "val"]


def test_installed_lift3d_has_its_recipes_and_sample_scene():
    """Whichever lift3d this runs against (the checkout, or the installed wheel in CI's wheel job): the recipes the
    commands pick exist and the sample scene has all its photos."""
    for name in ("reconstruct-gaussians-sample", "reconstruct-gaussians", "reconstruct-gaussians-cpu", "reconstruct-nerf",
                 "reconstruct-nerf-cpu", "dreamfusion-sd", "gaussian-sds", "dreamgaussian-image"):
        assert recipe_config(name).is_file(), name
    assert len(recipe_names()) >= 30
    scene = sample_scene_path()
    for split, count in (("train", N_TRAIN), ("val", N_VAL)):
        frames = json.loads((scene / f"transforms_{split}.json").read_text())["frames"]
        assert len(frames) == count and len(list((scene / split).glob("*.png"))) == count
