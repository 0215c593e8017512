"""The scene summary (lift3d.data.summary): what each data module tells the systems of its training data, handed to
the system by the runner; no system reaches into a data module for it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lift3d.config import load_config
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.random_views import RandomViewsDataModule
from lift3d.data.sample_scene import sample_scene_path
from lift3d.data.single_image import SingleImageDataModule
from lift3d.data.summary import SceneSummary
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_parts
from tests.conftest import REPO

SYSTEMS = REPO / "lift3d" / "systems"


def _data_module_reads(path: Path) -> list[str]:
    """Where a module of the systems reaches for a data module: the name ``datamodule`` (``trainer.datamodule``, a
    variable) or a ``getattr`` / ``hasattr`` that names it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr == "datamodule":
            found.append(f"{path.name}:{node.lineno}: .datamodule")
        elif isinstance(node, ast.Name) and node.id == "datamodule":
            found.append(f"{path.name}:{node.lineno}: datamodule")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            named = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any("datamodule" in name for name in named) or "datamodule" in ast.unparse(node.args[0]):
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_system_probes_the_data_module():
    modules = sorted(SYSTEMS.glob("*.py"))
    assert len(modules) > 10
    found = [hit for path in modules for hit in _data_module_reads(path)]
    assert not found, "systems read self.scene (a SceneSummary), never the data module: " + "; ".join(found)


def test_the_check_finds_a_probe(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def setup(self):\n    data = getattr(self.trainer, 'datamodule', None)\n    return data\n")
    assert _data_module_reads(probe) == ["probe.py:2: getattr(self.trainer, 'datamodule', None)"]
    probe.write_text("def setup(self, datamodule):\n    return hasattr(datamodule, 'extent')\n")
    assert len(_data_module_reads(probe)) == 2  # the name, and the probe of it
    probe.write_text("def setup(self):\n    return self.trainer.datamodule.train\n")
    assert _data_module_reads(probe) == ["probe.py:2: .datamodule"]


def test_posed_photos_summarize_their_training_split():
    data = PosedImagesDataModule({"root": str(sample_scene_path()), "batch_mode": "rays"})
    scene = data.scene_summary()
    n = len(data.train)
    assert scene.n_photos == n and scene.cameras is data.train.cameras and scene.images is data.train.rgba
    assert scene.image_sizes == ((data.train.cameras.width, data.train.cameras.height),) * n and not scene.mixed_sizes
    assert scene.extent == pytest.approx(data.extent) and scene.extent > 0
    assert torch.equal(scene.background, torch.ones(3)) and scene.has_masks  # the sample scene's cut-outs
    assert scene.capture_format == "blender" and scene.object_centric and scene.batches_name_their_photos
    assert scene.reference is None and scene.points is None
    assert scene.edit_targets() is data.editable_targets()  # the data module's one store, made on first use
    with pytest.raises(dataclasses.FrozenInstanceError):
        scene.extent = 2.0  # type: ignore[misc]


def test_photos_of_several_sizes_keep_each_size(tmp_path):
    from tests.mixed_photo_sets import HOLDOUT, write_colmap_scene

    root = write_colmap_scene(tmp_path / "orientations", "orientations")
    data = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT})
    scene = data.scene_summary()
    assert scene.mixed_sizes and list(scene.image_sizes) == [data.train.size(i) for i in range(len(data.train))]
    assert max(w for w, _ in scene.image_sizes) == scene.cameras.width  # padded to the largest
    assert scene.capture_format == "colmap" and not scene.object_centric


def test_generation_and_image_to_3d_summaries(tmp_path):
    generation = RandomViewsDataModule({}).scene_summary()
    assert generation.n_photos == 0 and generation.cameras is None and generation.object_centric
    assert generation.reference is None and generation.edit_targets is None and generation.extent == 0.0
    yy, xx = np.mgrid[0:48, 0:40]
    rgba = np.zeros((48, 40, 4), np.uint8)
    rgba[..., 1] = 200
    rgba[..., 3] = (((xx - 20) ** 2 + (yy - 24) ** 2) < 15**2) * 255
    Image.fromarray(rgba, "RGBA").save(tmp_path / "photo.png")
    data = SingleImageDataModule({"image": str(tmp_path / "photo.png"), "reference_size": 32,
                                  "reference_background": [0.0, 0.0, 1.0]})
    scene = data.scene_summary()
    assert scene.reference is data.reference and scene.reference.rgba.shape == (32, 32, 4)
    assert torch.equal(scene.background, torch.tensor([0.0, 0.0, 1.0])) and scene.n_photos == 0


def test_the_runner_hands_the_summary_to_the_system():
    cfg = load_config(recipe_config("reconstruct-gaussians"),
                      overrides=[f"data.root={sample_scene_path()}", "system.renderer.backend=torch"])
    datamodule, system = build_parts(cfg)
    assert isinstance(system.scene, SceneSummary) and system.scene.n_photos == len(datamodule.train)
    assert system.scene.cameras is datamodule.train.cameras
    from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem

    assert ReconstructGaussiansSystem(cfg.system).scene is None  # built without data (an export): no scene
