"""Scene readers: COLMAP (binary, text), nerfstudio and instant-ngp transforms.json, Blender — one scene
written in each layout by the test must come back as the same cameras."""

import json
import logging
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from lift3d.config import ConfigError
from lift3d.data.capture import SceneFormatError
from lift3d.data.colmap_model import (
    ColmapCamera,
    ColmapImage,
    ColmapModel,
    ColmapPoint,
    read_model,
    write_model_binary,
    write_model_text,
)
from lift3d.data.formats.colmap import c2w_from_colmap
from lift3d.data.normalize import normalizing_transform, rotation_between, transform_poses
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.scene import detect_format
from lift3d.rotations import matrix_to_quaternion_np, quaternion_to_matrix_np

W, H = 24, 16
GL_FROM_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=4)
    return quaternion_to_matrix_np(q / np.linalg.norm(q))


def inward_c2w(n: int, rng: np.random.Generator, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Cameras (OpenGL c2w) on a ring looking at a point, in a tilted world frame."""
    from lift3d.cameras import look_at

    angles = np.linspace(0, 2 * np.pi, n, endpoint=False)
    eye = np.stack([3 * np.cos(angles), 3 * np.sin(angles), 1.0 + 0.2 * rng.normal(size=n)], -1)
    c2w = look_at(torch.tensor(eye, dtype=torch.float64), torch.zeros(n, 3, dtype=torch.float64),
                  torch.tensor(up, dtype=torch.float64).expand(n, 3)).numpy()
    world = np.eye(4)
    world[:3, :3] = random_rotation(rng)
    world[:3, 3] = rng.normal(size=3)
    return world @ c2w


def write_images(folder, names, rng):
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        Image.fromarray(rng.integers(0, 255, (H, W, 3), dtype=np.uint8)).save(folder / name)


def colmap_model_of(c2w: np.ndarray, names, rng, camera=None) -> ColmapModel:
    camera = camera or ColmapCamera(1, "OPENCV", W, H, np.array([20.0, 21.0, 12.5, 7.5, 0.01, -0.02, 0.001, 0.002]))
    images = {}
    for i, (pose, name) in enumerate(zip(c2w, names), start=1):
        w2c = np.linalg.inv(pose @ GL_FROM_CV)
        xys = rng.uniform(0, W, (3, 2))
        images[i] = ColmapImage(i, matrix_to_quaternion_np(w2c[:3, :3]), w2c[:3, 3], 1, name, xys, np.array([1, -1, 2]))
    points = {k: ColmapPoint(k, rng.normal(size=3), rng.integers(0, 255, 3).astype(np.uint8), 0.5,
                             np.array([[1, 0], [2, 2]])) for k in (1, 2)}
    return ColmapModel({1: camera}, images, points)


def test_quaternions_round_trip():
    rng = np.random.default_rng(0)
    for _ in range(20):
        R = random_rotation(rng)
        q = matrix_to_quaternion_np(R)
        assert q[0] >= 0 and np.allclose(quaternion_to_matrix_np(q), R, atol=1e-10)


@pytest.mark.parametrize("writer", [write_model_binary, write_model_text])
def test_colmap_model_round_trip(tmp_path, writer):
    rng = np.random.default_rng(1)
    names = [f"im_{i}.png" for i in range(5)]
    model = colmap_model_of(inward_c2w(5, rng), names, rng)
    writer(model, tmp_path)
    back = read_model(tmp_path)
    assert back.cameras[1].model == "OPENCV" and np.allclose(back.cameras[1].params, model.cameras[1].params)
    for k, image in model.images.items():
        other = back.images[k]
        assert other.name == image.name and other.camera_id == 1
        assert np.allclose(other.qvec, image.qvec) and np.allclose(other.tvec, image.tvec)
        assert np.allclose(other.xys, image.xys) and (other.point3d_ids == image.point3d_ids).all()
    for k, point in model.points.items():
        assert np.allclose(back.points[k].xyz, point.xyz) and (back.points[k].rgb == point.rgb).all()
        assert (back.points[k].track == point.track).all()


def test_truncated_binary_model_is_a_clear_error(tmp_path):
    rng = np.random.default_rng(2)
    write_model_binary(colmap_model_of(inward_c2w(3, rng), ["a.png", "b.png", "c.png"], rng), tmp_path)
    data = (tmp_path / "images.bin").read_bytes()
    (tmp_path / "images.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(SceneFormatError, match="truncated"):
        read_model(tmp_path)


def scene_in_every_layout(tmp_path):
    """One capture of 9 frames written as COLMAP binary, COLMAP text, nerfstudio and instant-ngp folders."""
    rng = np.random.default_rng(3)
    names = [f"frame_{i:02d}.png" for i in range(9)]
    c2w = inward_c2w(9, rng)
    fx, fy, cx, cy, k1, k2, p1, p2 = 20.0, 21.0, 12.5, 7.5, 0.01, -0.02, 0.001, 0.002
    model = colmap_model_of(c2w, names, rng)
    layouts = {}
    for kind, writer in (("colmap-bin", write_model_binary), ("colmap-txt", write_model_text)):
        root = tmp_path / kind
        write_images(root / "images", names, np.random.default_rng(4))
        writer(model, root / "sparse" / "0")
        layouts[kind] = root
    frames = [{"file_path": f"images/{n}", "transform_matrix": pose.tolist()} for n, pose in zip(names, c2w)]
    ns = {"camera_model": "OPENCV", "fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": W, "h": H,
          "k1": k1, "k2": k2, "p1": p1, "p2": p2, "frames": frames}
    # instant-ngp: no camera_model, field of view instead of focal lengths, per-frame sharpness, aabb_scale
    ngp = {"camera_angle_x": 2 * np.arctan(W / (2 * fx)), "camera_angle_y": 2 * np.arctan(H / (2 * fy)), "cx": cx, "cy": cy,
           "k1": k1, "k2": k2, "p1": p1, "p2": p2, "aabb_scale": 4,
           "frames": [{**f, "sharpness": 30.0} for f in frames]}
    for kind, meta in (("nerfstudio", ns), ("instant-ngp", ngp)):
        root = tmp_path / kind
        write_images(root / "images", names, np.random.default_rng(4))
        (root / "transforms.json").write_text(json.dumps(meta))
        layouts[kind] = root
    return layouts, c2w


def test_every_layout_gives_the_same_cameras(tmp_path):
    layouts, c2w = scene_in_every_layout(tmp_path)
    assert {kind: detect_format(root) for kind, root in layouts.items()} == {
        "colmap-bin": "colmap", "colmap-txt": "colmap", "nerfstudio": "transforms", "instant-ngp": "transforms"}
    modules = {kind: PosedImagesDataModule({"root": str(root)}) for kind, root in layouts.items()}
    reference = modules["colmap-bin"]
    for kind, module in modules.items():
        assert module.splits == {"train": [1, 2, 3, 4, 5, 6, 7], "val": [0, 8]}, kind  # every 8th frame held out
        assert torch.allclose(module.train.cameras.c2w, reference.train.cameras.c2w, atol=1e-5), kind
        assert torch.allclose(module.train.cameras.intrinsics, reference.train.cameras.intrinsics, atol=1e-4), kind
        assert torch.equal(module.train.rgba, reference.train.rgba), kind
        assert module.capture.frames[0].lens.kind == "opencv"
    # the colmap poses are the written ones, moved by the recorded normalization
    normalized = transform_poses(reference.normalization, c2w)[1:8]
    assert np.allclose(normalized, reference.train.cameras.c2w.double().numpy(), atol=1e-5)
    assert reference.points is not None and modules["nerfstudio"].points is None


def test_colmap_pose_conversion_matches_a_projection():
    rng = np.random.default_rng(5)
    R, t = random_rotation(rng), rng.normal(size=3)
    point = rng.normal(size=3)
    camera_point = R @ point + t  # COLMAP: world -> camera, OpenCV axes (z forward)
    c2w = c2w_from_colmap(matrix_to_quaternion_np(R), t)
    local = np.linalg.inv(c2w) @ np.append(point, 1.0)  # OpenGL camera axes: x right, y up, -z forward
    assert np.allclose(local[:3], camera_point * [1, -1, -1])


def test_normalization_puts_the_focus_at_the_origin_with_z_up():
    rng = np.random.default_rng(6)
    c2w = inward_c2w(12, rng)
    T, record = normalizing_transform(c2w, camera_distance=4.0)
    moved = transform_poses(T, c2w)
    assert record["center_is"].startswith("focus point")
    assert np.allclose(np.linalg.norm(moved[:, :3, 3], axis=1).mean(), 4.0)
    up = moved[:, :3, 1].mean(0)
    assert np.allclose(up / np.linalg.norm(up), [0, 0, 1], atol=1e-9)  # the cameras' mean up is +z
    forward = -moved[:, :3, 2]
    miss = np.cross(forward, -moved[:, :3, 3])  # each optical axis passes near the origin
    assert np.abs(miss).max() < 0.5
    assert np.allclose(rotation_between(np.array([0, 0, -1.0]), np.array([0, 0, 1.0])) @ [0, 0, -1.0], [0, 0, 1])
    for R in moved[:, :3, :3]:
        assert np.allclose(R.T @ R, np.eye(3), atol=1e-9)


def test_split_is_written_into_the_run(tmp_path):
    layouts, _ = scene_in_every_layout(tmp_path)
    module = PosedImagesDataModule({"root": str(layouts["nerfstudio"]), "holdout_every": 3})
    record = json.loads(module.write_records(tmp_path / "run").read_text())
    assert record["format"] == "nerfstudio" and len(record["splits"]["val"]) == 3
    assert record["splits"]["val"] == ["images/frame_00.png", "images/frame_03.png", "images/frame_06.png"]
    assert any("undistorted" in note for note in record["lens_notes"])


def test_missing_frames_are_skipped_with_one_warning(tmp_path, caplog):
    layouts, _ = scene_in_every_layout(tmp_path)
    root = layouts["instant-ngp"]
    (root / "images" / "frame_03.png").unlink()
    (root / "images" / "frame_05.png").unlink()
    with caplog.at_level(logging.WARNING, logger="lift3d.data"):
        module = PosedImagesDataModule({"root": str(root)})
    assert len(module.capture.frames) == 7
    assert "2 of 9 frames" in caplog.text and "frame_03.png" in caplog.text
    shutil.rmtree(root / "images")
    (root / "images").mkdir()
    with pytest.raises(SceneFormatError, match="none of the 9 frames"):
        PosedImagesDataModule({"root": str(root)})


def test_images_of_differing_sizes_each_keep_their_own_size(tmp_path):
    """A frame whose photo is larger than the rest loads at its own size (read from its header when the file gives
    no one size): the photos are padded to the largest, and the padding is marked as never compared."""
    layouts, _ = scene_in_every_layout(tmp_path)
    root = layouts["nerfstudio"]
    meta = json.loads((root / "transforms.json").read_text())
    for key in ("w", "h"):
        meta.pop(key)
    (root / "transforms.json").write_text(json.dumps(meta))
    Image.fromarray(np.full((H * 2, W * 2, 3), 7, np.uint8)).save(root / "images" / "frame_04.png")
    module = PosedImagesDataModule({"root": str(root), "undistort": False})
    train = module.train
    big = [i for i, path in enumerate(train.paths) if path.endswith("frame_04.png")][0]
    assert train.rgba.shape[1:3] == (H * 2, W * 2) and train.mixed_sizes
    assert train.size(big) == (W * 2, H * 2) and {train.size(i) for i in range(len(train)) if i != big} == {(W, H)}
    assert train.keep is not None and bool(train.keep[big].all())
    other = (big + 1) % len(train)
    assert int(train.keep[other].sum()) == W * H and not train.keep[other, H:].any() and not train.keep[other, :, W:].any()
    assert torch.allclose(train.cameras.intrinsics[other], train.cameras.intrinsics[big])  # intrinsics as the file says


def test_blender_scenes_keep_their_frame_and_splits(data_dir):
    module = PosedImagesDataModule({"root": str(data_dir / "lego_tiny")})
    assert module.capture.format == "blender" and set(module.splits) == {"train", "val"}
    meta = json.loads((data_dir / "lego_tiny" / "transforms_train.json").read_text())
    assert np.allclose(module.train.cameras.c2w[0].numpy(), np.array(meta["frames"][0]["transform_matrix"]), atol=1e-6)


def test_an_unknown_folder_names_the_layouts(tmp_path):
    with pytest.raises(SceneFormatError, match="nerfstudio or instant-ngp"):
        detect_format(tmp_path)
    with pytest.raises(ConfigError, match="format must be one of auto, blender"):
        PosedImagesDataModule({"root": str(tmp_path), "format": "llff"})
