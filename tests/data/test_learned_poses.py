"""Predicted poses as a COLMAP model: points unprojected from confident depth, the model as other tools read it, the
record that ties it to its poses' origin, and the training overrides that record turns on."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lift3d.data.colmap_model import read_model, write_model_binary
from lift3d.data.learned_poses import (
    RECORD,
    LearnedPoseOptions,
    PosePrediction,
    depth_points,
    learned_pose_overrides,
    read_record,
    run_learned_poses,
    write_prediction,
)
from lift3d.recipes import recipe_config
from lift3d.rotations import quaternion_to_matrix_np


def _prediction(n=3, h=6, w=8, depth=2.0) -> PosePrediction:
    """Cameras on a line looking down +z (OpenCV) at a wall z = depth in front of the first; a depth grid at half the
    photos' resolution (photos 16 x 12)."""
    K_depth = np.array([[8.0, 0, 4], [0, 8.0, 3], [0, 0, 1]])
    w2c = np.stack([np.concatenate([np.eye(3), [[-0.5 * i], [0.0], [0.0]]], 1) for i in range(n)])
    colors = np.zeros((n, h, w, 3), np.uint8)
    colors[..., 0] = np.arange(w, dtype=np.uint8) * 20
    confidence = np.full((n, h, w), 9.0, np.float32)
    confidence[:, 0] = 2.0  # the top row is unsure
    confidence[:, 1, 0] = 0.0  # a pixel that shows no photo
    return PosePrediction([f"p{i}.jpg" for i in range(n)], np.array([[16, 12]] * n), np.stack([K_depth * [[2], [2], [1]]] * n),
                          w2c, np.full((n, h, w), depth, np.float32), confidence, colors, np.stack([K_depth] * n))


def test_points_come_from_confident_depth_in_the_world_frame():
    prediction = _prediction()
    points, colors = depth_points(prediction, min_confidence=5.0, budget=10_000)
    assert len(points) == 3 * (5 * 8 - 1)  # every confident pixel once
    assert np.allclose(points[:, 2], 2.0)  # on the wall
    # the second camera sits 0.5 along x: its pixel centers land 0.5 further along in the world
    first = points[: 39]
    second = points[39: 78]
    assert np.allclose(second[:, 0] - first[:, 0], 0.5)
    assert np.allclose(first[:7, 1], (1.5 - 3) / 8 * 2.0) and np.allclose(first[0, 0], (1.5 - 4) / 8 * 2.0)
    assert colors[:7, 0].tolist() == [20 * c for c in range(1, 8)]  # row 1 starts at column 1 (column 0 shows no photo)
    few, _ = depth_points(prediction, 5.0, budget=10)
    assert len(few) == 10 and {tuple(p) for p in few.tolist()} <= {tuple(p) for p in points.tolist()}
    unsure, _ = depth_points(prediction, min_confidence=50.0, budget=10_000)  # nothing that sure: the surest quarter
    assert 0 < len(unsure) <= len(points)


def test_the_model_reads_back_in_lift3d_and_in_colmap(tmp_path):
    prediction = _prediction()
    points, colors = depth_points(prediction, 5.0, 10_000)
    model_dir = write_prediction(tmp_path, prediction, points, colors, {"method": "vggt", "weights": "w.pt"})
    assert model_dir == tmp_path / "sparse" / "0"
    model = read_model(model_dir)
    assert [c.model for c in model.cameras.values()] == ["PINHOLE"] * 3
    assert (model.cameras[1].width, model.cameras[1].height) == (16, 12)
    assert model.cameras[1].params.tolist() == [16.0, 16.0, 8.0, 6.0]  # the photo's own pixels, not the depth grid's
    assert np.allclose(quaternion_to_matrix_np(model.images[2].qvec), np.eye(3))
    assert np.allclose(model.images[2].tvec, [-0.5, 0, 0])
    assert len(model.points) == len(points)
    import pycolmap

    other = pycolmap.Reconstruction(model_dir)  # COLMAP itself reads it
    assert other.num_reg_images() == 3 and other.num_points3D() == len(points)
    assert sorted(image.name for image in other.images.values()) == ["p0.jpg", "p1.jpg", "p2.jpg"]
    record = read_record(tmp_path)
    assert record["method"] == "vggt" and record["photos"] == 3 and record["points"] == len(points)
    other.write(model_dir)  # the same model written again by COLMAP: still the predicted poses
    assert read_record(tmp_path) == record
    # another model written over it (structure from motion run again) leaves the record stale: it no longer counts
    model.images[2].tvec = np.array([-0.4, 0.0, 0.0])
    write_model_binary(model, model_dir)
    assert (model_dir / RECORD).is_file() and read_record(tmp_path) is None


def test_learned_poses_turn_pose_refinement_on_where_the_recipe_has_it(tmp_path):
    prediction = _prediction()
    assert learned_pose_overrides(tmp_path, recipe_config("reconstruct-gaussians")) == []  # no model yet
    write_prediction(tmp_path, prediction, *depth_points(prediction, 5.0, 100), {"method": "vggt"})
    assert learned_pose_overrides(tmp_path, recipe_config("reconstruct-gaussians-cpu")) == ["system.pose_refinement.enabled=true"]
    assert learned_pose_overrides(tmp_path, recipe_config("reconstruct-nerf")) == []  # the NeRF recipe refines no poses


class _Stub:
    """A predictor that answers with a fixed prediction and counts its calls."""

    def __init__(self, prediction):
        self.prediction, self.calls = prediction, 0

    def record(self):
        return {"method": "stub"}

    def predict(self, folder, names):
        self.calls += 1
        assert names == self.prediction.names and all((folder / n).is_file() for n in names)
        return self.prediction


def test_a_photo_folder_is_posed_once(tmp_path):
    from PIL import Image

    images = tmp_path / "scene" / "images"
    images.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (16, 12), (i * 50, 0, 0)).save(images / f"p{i}.jpg")
    stub = _Stub(_prediction())
    options = LearnedPoseOptions(points=25)
    assert run_learned_poses(tmp_path / "scene", stub, options) == tmp_path / "scene"
    assert stub.calls == 1 and set(options.stage_seconds) == {"prediction", "writing"}
    assert len(read_model(tmp_path / "scene" / "sparse" / "0").points) == 25
    assert json.loads((tmp_path / "scene" / "sparse" / "0" / RECORD).read_text())["min_confidence"] == 5.0
    run_learned_poses(tmp_path / "scene", stub)  # posed already: nothing to do
    assert stub.calls == 1
    run_learned_poses(tmp_path / "scene", stub, LearnedPoseOptions(force=True))
    assert stub.calls == 2
    (images / "p1.jpg").unlink()
    (images / "p2.jpg").unlink()
    with pytest.raises(ValueError, match="holds 1 photo"):
        run_learned_poses(tmp_path / "scene", stub, LearnedPoseOptions(force=True))
