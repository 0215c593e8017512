"""`lift3d poses --method vggt` and `lift3d reconstruct --poses vggt` with a tiny VGGT of the released layout: photos of
mixed sizes posed into the COLMAP model SfM would write, trained from with pose refinement on; missing or damaged
weights refused in one line (exit 2)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from lift3d.cli import main
from lift3d.commands import poses as poses_command
from lift3d.data.colmap_model import read_model
from lift3d.generators import vggt_files, vggt_images
from tests.sfm_scene import render_photos
from tests.tiny_vggt import SIZE, tiny_state, write_tiny_vggt


@pytest.fixture(autouse=True)
def no_weights_on_this_machine(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.delenv("LIFT3D_VGGT_WEIGHTS", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture
def photos(tmp_path):
    """Six photos of the sample toy: landscape and portrait, JPG and PNG, as a phone and an export would mix them."""
    from lift3d.data.sample_scene import sample_cameras

    folder = tmp_path / "scene" / "images"
    folder.mkdir(parents=True)
    cameras = sample_cameras("train", 48)[:30:5]
    for i, photo in enumerate(render_photos(cameras)):
        image = Image.fromarray(photo)
        if i % 3 == 1:
            image = image.resize((48, 64))
        image.save(folder / (f"photo_{i}.png" if i % 2 else f"photo_{i}.jpg"))
    return tmp_path / "scene"


def test_the_commands_constants_are_the_models():
    from lift3d.data.learned_poses import POSE_METHODS
    from lift3d.data.sfm import MATCHERS

    assert poses_command.POSE_METHODS == POSE_METHODS and poses_command.MATCHERS == MATCHERS
    assert poses_command.ENV_VAR == vggt_files.ENV_VAR
    assert poses_command.MODES == vggt_images.MODES and poses_command.TARGET == vggt_images.TARGET


def test_photos_posed_by_vggt_train_with_refined_poses(photos, tmp_path, capsys):
    weights = write_tiny_vggt(tmp_path / "release")
    assert main(["poses", str(photos), "--method", "vggt", "--vggt-weights", str(weights), "--vggt-size", str(SIZE),
                 "--points", "3000"]) == 0
    out = capsys.readouterr()
    assert "poses written to" in out.out and "by VGGT" in out.out and "license: a local file" in out.err
    model = read_model(photos / "sparse" / "0")
    sizes = {image.name: (model.cameras[image.camera_id].width, model.cameras[image.camera_id].height)
             for image in model.images.values()}
    assert sizes["photo_1.png"] == (48, 64) and sizes["photo_0.jpg"] == (48, 48)  # each camera at its photo's size
    assert {c.model for c in model.cameras.values()} == {"PINHOLE"} and len(model.points) == 3000
    # a second run reuses the model; auto finds the weights through the environment and says it is VGGT's turn
    assert main(["poses", str(photos), "--vggt-weights", str(weights)]) == 0
    assert "already has poses" in capsys.readouterr().out
    runs = tmp_path / "runs"
    assert main(["reconstruct", str(photos), "trainer.max_steps=3", "trainer.val_check_interval=3",
                 "trainer.run_test_after_fit=false", "system.export.formats=[]", f"output_root={runs}",
                 "trainer.enable_progress_bar=false", "data.holdout_every=3"]) == 0
    err = capsys.readouterr().err
    assert "training refines them" in err and "camera pose refinement on" in err
    assert "initialized 3000 Gaussians (sfm)" in err  # the dense start
    metrics = json.loads(next(runs.rglob("metrics.json")).read_text())
    assert math.isfinite(metrics["val"]["psnr"])
    parsed = next(runs.rglob("parsed.yaml")).read_text()
    assert "enabled: true" in parsed.split("pose_refinement:")[1].split("lr:")[0]


def test_reconstruct_poses_unposed_photos_with_vggt_when_asked(photos, tmp_path, monkeypatch, capsys):
    weights = write_tiny_vggt(tmp_path / "release")
    monkeypatch.setenv("LIFT3D_VGGT_WEIGHTS", str(weights))
    calls = []
    from lift3d.generators import vggt

    real = vggt.VggtPredictor

    def small(*args, **kwargs):  # the tiny model at its small input size
        calls.append(args)
        return real(*args, **{**kwargs, "resolution": SIZE})

    monkeypatch.setattr(vggt, "VggtPredictor", small)
    runs = tmp_path / "runs"
    assert main(["reconstruct", str(photos), "--poses", "vggt", "trainer.max_steps=1", "trainer.val_check_interval=1",
                 "trainer.run_test_after_fit=false", "system.export.formats=[]", f"output_root={runs}",
                 "trainer.enable_progress_bar=false", "system.pose_refinement.enabled=false"]) == 0
    err = capsys.readouterr().err
    assert calls == [(weights,)] and "posing the photos with VGGT" in err
    assert "camera pose refinement on" not in err  # the user's override wins over the record's


def test_missing_or_damaged_weights_are_refused_in_one_line(photos, tmp_path, capsys):
    assert main(["poses", str(photos), "--method", "vggt"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no VGGT weights" in err and "CC-BY-NC-4.0" in err and "--method sfm" in err
    assert main(["poses", str(photos), "--method", "vggt", "--vggt-weights", str(tmp_path / "nowhere")]) == 2
    assert "nowhere (--vggt-weights) does not exist" in capsys.readouterr().err
    state = {k: v for k, v in tiny_state().items() if not k.startswith("depth_head.scratch.refinenet1.")}
    torch.save(state, tmp_path / "model.pt")
    assert main(["poses", str(photos), "--method", "vggt", "--vggt-weights", str(tmp_path / "model.pt")]) == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("lift3d: error:")]
    assert "Traceback" not in err
    said = f"{tmp_path / 'model.pt'} does not fit VGGT's released layout: tensors 10 missing (depth_head.scratch.refinenet1"
    assert said in line
    assert "facebook/VGGT-1B-Commercial (the VGGT license" in line
    assert not (photos / "sparse").exists()
    assert main(["poses", str(photos), "--points", "-1"]) == 2
    assert "--points must be" in capsys.readouterr().err
