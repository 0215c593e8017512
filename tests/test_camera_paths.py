"""Camera paths through a capture's cameras (``lift3d.camera_paths``) and the test video of posed captures: photos
from one side give a path along that side (ordered, smooth, looking where the photos look, the subject in frame), an
all-around capture a closed loop, object-centric renders an orbit; frames at the photos' size, capped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from lift3d.camera_paths import camera_path_through, interpolate_keyframes
from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.data.normalize import transform_points
from lift3d.data.posed_images import PosedImagesDataModule
from lift3d.data.sample_scene import sample_scene_path
from lift3d.rotations import matrix_to_quaternion, quaternion_to_matrix, slerp

# the sample scene's toy (lift3d.data.sample_scene.render_toy): box, ball, post and bead inside this box
SUBJECT_LOW, SUBJECT_HIGH = (-0.8, -0.8, -0.9), (0.8, 0.8, 0.6)


def _ring(azimuths_deg, distance=4.0, elevation_deg=20.0, size=(48, 32)) -> Cameras:
    azimuth, elevation = torch.deg2rad(torch.tensor(azimuths_deg, dtype=torch.float32)), math.radians(elevation_deg)
    eye = distance * torch.stack([torch.cos(azimuth) * math.cos(elevation), torch.sin(azimuth) * math.cos(elevation),
                                  torch.full_like(azimuth, math.sin(elevation))], -1)
    c2w = look_at(eye, torch.zeros_like(eye), torch.tensor([0.0, 0.0, 1.0]).expand_as(eye))
    return Cameras(c2w, intrinsics_from_fovy(torch.full((len(eye),), math.radians(40.0)), *size), *size)


def _azimuth_deg(cameras: Cameras) -> np.ndarray:
    p = cameras.positions.double()
    return np.degrees(np.arctan2(p[:, 1].numpy(), p[:, 0].numpy()))


def _off_axis_deg(cameras: Cameras, point: torch.Tensor) -> torch.Tensor:
    """Angle [N] between each camera's optical axis (-z) and the direction to ``point``."""
    forward = torch.nn.functional.normalize(-cameras.c2w[:, :3, 2].double(), dim=-1)
    to_point = torch.nn.functional.normalize(point.double() - cameras.positions.double(), dim=-1)
    return torch.rad2deg(torch.acos((forward * to_point).sum(-1).clamp(-1, 1)))


def test_slerp_and_quaternions_round_trip():
    c2w = _ring([0.0, 70.0, 200.0]).c2w
    q = matrix_to_quaternion(c2w[:, :3, :3].double())

    assert torch.allclose(quaternion_to_matrix(q).float(), c2w[:, :3, :3], atol=1e-5)
    halfway = slerp(q[:1], q[1:2], torch.tensor([0.5], dtype=torch.float64))
    assert torch.allclose((halfway * q[0]).sum().abs(), (halfway * q[1]).sum().abs(), atol=1e-9)  # equally far


def test_a_one_sided_capture_in_any_order_gives_a_path_along_its_side():
    shuffled = [150.0, 30.0, 90.0, 10.0, 170.0, 60.0, 120.0, 45.0, 135.0, 75.0]  # photos over half a turn, shuffled
    photos = _ring(shuffled)
    path = camera_path_through(photos, 40)
    azimuth = _azimuth_deg(path)
    steps = np.diff(azimuth)
    assert (steps > 0).all() or (steps < 0).all()  # one sweep from one end of the photos to the other
    assert {round(azimuth[0]), round(azimuth[-1])} == {10, 170}
    assert azimuth.min() > 9 and azimuth.max() < 171  # never round to the side nobody photographed
    assert _off_axis_deg(path, torch.zeros(3)).max() < 1.0  # looking at what the photos look at
    # merged neighbors stand on their chord: a little inside the photos' circle, never far
    assert torch.allclose(path.positions.norm(dim=-1), torch.tensor(4.0), atol=0.1)
    speed = path.positions[1:].sub(path.positions[:-1]).norm(dim=-1)
    assert speed.max() < 1.5 * speed.min()  # an even pace
    assert (path.width, path.height) == (48, 32)
    assert torch.allclose(path.intrinsics[:, 1, 1], photos.intrinsics[0, 1, 1])


def test_there_and_back_loops_an_open_path():
    path = camera_path_through(_ring([0.0, 40.0, 80.0]), 21, there_and_back=True)
    azimuth = _azimuth_deg(path)
    assert len(path) == 21 and abs(azimuth[0]) < 1e-3 and abs(azimuth[10] - 80) < 1e-3
    assert np.allclose(azimuth[1:10], azimuth[11:20][::-1], atol=1e-4)  # back along the same way


def test_photos_all_around_make_a_closed_loop():
    photos = _ring(list(np.arange(0.0, 360.0, 30.0)))
    path = camera_path_through(photos, 36)
    azimuth = np.unwrap(np.radians(_azimuth_deg(path)))
    assert abs(abs(azimuth[-1] - azimuth[0]) - math.radians(350)) < math.radians(3)  # a full turn, not repeating frame 0
    assert _off_axis_deg(path, torch.zeros(3)).max() < 1.0


def test_a_forward_facing_capture_slides_along_its_cameras():
    x = torch.tensor([0.3, -0.6, 0.0, 0.9, -0.3, 0.6, -0.9])
    eye = torch.stack([x, torch.full_like(x, -3.0), torch.zeros_like(x)], -1)
    c2w = look_at(eye, eye + torch.tensor([0.0, 1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0]).expand_as(eye))
    photos = Cameras(c2w, intrinsics_from_fovy(torch.full((7,), 0.8), 32, 32), 32, 32)
    path = camera_path_through(photos, 15)
    xs = path.positions[:, 0]
    assert torch.all(torch.diff(xs) > 0) or torch.all(torch.diff(xs) < 0)
    assert torch.allclose(path.positions[:, 1:], torch.tensor([-3.0, 0.0]), atol=0.01)
    assert torch.allclose(path.c2w[:, :3, 2], torch.tensor([0.0, -1.0, 0.0]), atol=1e-4)  # looking ahead, as they do


def test_keyframes_interpolate_through_their_ends_and_a_single_camera_stays():
    positions = torch.tensor([[0.0, 0, 0], [1, 0, 0], [2, 1, 0]], dtype=torch.float64)
    quats = torch.tensor([[1.0, 0, 0, 0]] * 3, dtype=torch.float64)
    c2w = interpolate_keyframes(positions, quats, 9)
    assert torch.allclose(c2w[0, :3, 3], positions[0]) and torch.allclose(c2w[-1, :3, 3], positions[-1])
    single = camera_path_through(_ring([30.0]), 5)
    assert torch.allclose(single.c2w, _ring([30.0]).c2w.expand(5, 4, 4))


def _one_sided_capture(folder: Path) -> Path:
    """The sample scene's training photos taken from y > 0 only, as a nerfstudio transforms.json capture of JPEGs on
    white (as a phone capture is: no alpha, not object-centric)."""
    source = sample_scene_path()
    meta = json.loads((source / "transforms_train.json").read_text())
    (folder / "images").mkdir(parents=True, exist_ok=True)
    frames = []
    for frame in meta["frames"]:
        c2w = np.array(frame["transform_matrix"])
        if c2w[1, 3] <= 0:
            continue
        rgba = Image.open(source / f"{frame['file_path']}.png").convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        name = f"{Path(frame['file_path']).name}.jpg"
        Image.alpha_composite(white, rgba).convert("RGB").save(folder / "images" / name, quality=95)
        frames.append({"file_path": f"images/{name}", "transform_matrix": c2w.tolist()})
    width, height = rgba.size
    focal = width / 2 / math.tan(meta["camera_angle_x"] / 2)
    (folder / "transforms.json").write_text(json.dumps({"camera_model": "OPENCV", "fl_x": focal, "fl_y": focal,
                                                        "cx": width / 2, "cy": height / 2, "w": width, "h": height,
                                                        "frames": frames}))
    return folder


def _subject_corners(module: PosedImagesDataModule) -> torch.Tensor:
    corners = np.array([[x, y, z] for x in (SUBJECT_LOW[0], SUBJECT_HIGH[0]) for y in (SUBJECT_LOW[1], SUBJECT_HIGH[1])
                        for z in (SUBJECT_LOW[2], SUBJECT_HIGH[2])])
    return torch.tensor(transform_points(module.normalization, corners), dtype=torch.float64)  # into the training frame


def _project(cameras: Cameras, points: torch.Tensor) -> torch.Tensor:
    """Pixel coordinates [B, P, 2] of world points [P, 3] (OpenGL cameras: +x right, +y up, looking along -z)."""
    w2c = torch.linalg.inv(cameras.c2w.double())
    local = points @ w2c[:, :3, :3].transpose(1, 2) + w2c[:, None, :3, 3]
    k = cameras.intrinsics.double()
    depth = -local[..., 2]
    u = k[:, None, 0, 0] * local[..., 0] / depth + k[:, None, 0, 2]
    v = k[:, None, 1, 2] - k[:, None, 1, 1] * local[..., 1] / depth
    return torch.stack([u, v], -1)


def _outside(cameras: Cameras, points: torch.Tensor) -> torch.Tensor:
    """[B] how many pixels the farthest of ``points`` lies outside each camera's frame (<= 0: all inside)."""
    pixels = _project(cameras, points)
    size = torch.tensor([cameras.width, cameras.height], dtype=pixels.dtype)
    return torch.maximum(-pixels, pixels - size).amax(dim=(1, 2))


@pytest.fixture(scope="module")
def one_sided(tmp_path_factory):
    root = _one_sided_capture(tmp_path_factory.mktemp("one-sided"))
    return root, PosedImagesDataModule({"root": str(root)})


def test_the_test_video_of_a_one_sided_capture_follows_its_photos(one_sided):
    """The acceptance of the one-sided capture: every frame looks at the subject as the photos do, sees it whole, and
    stands where photos were taken; the old orbit went round to the unseen side."""
    _, module = one_sided
    assert module.capture.format != "blender"
    cameras = module.video_cameras(30)
    assert (cameras.width, cameras.height) == (64, 64)  # the photos' own size
    center = torch.tensor(transform_points(module.normalization, np.zeros((1, 3)))[0])
    photos = module.train.cameras
    assert _off_axis_deg(cameras, center).max() <= _off_axis_deg(photos, center).max() + 5.0
    # the subject's box in frame as the photos frame it (its lowest corners touch the photos' edges: none lie further out)
    assert _outside(cameras, _subject_corners(module)).max() <= _outside(photos, _subject_corners(module)).max() + 0.5

    def nearest_photo_deg(views: Cameras) -> torch.Tensor:
        directions = torch.nn.functional.normalize(views.positions.double() - center, dim=-1)
        taken = torch.nn.functional.normalize(photos.positions.double() - center, dim=-1)
        return torch.rad2deg(torch.acos((directions @ taken.T).clamp(-1, 1))).min(dim=1).values

    assert nearest_photo_deg(cameras).max() < 25.0  # never far from where a photo was taken
    assert nearest_photo_deg(module.orbit_cameras(30)).max() > 60.0  # the orbit circled to the unphotographed side


def test_object_centric_renders_keep_the_orbit_and_the_video_size_is_capped(tmp_path):
    module = PosedImagesDataModule({"root": str(sample_scene_path())})
    assert torch.allclose(module.video_cameras(8).c2w, module.orbit_cameras(8).c2w)
    capped = PosedImagesDataModule({"root": str(sample_scene_path()), "video_max_side": 40})
    assert capped.video_size() == (40, 40) and capped.video_cameras(3).width == 40


def test_a_quick_fit_covers_the_subject_in_every_frame_of_the_video(one_sided, tmp_path):
    """Gaussians fitted briefly to the one-sided photos, rendered along the test video's path: wherever the toy itself
    is in a frame (ray-cast by the sample scene's own renderer at that camera), the fit is there too, in every frame."""
    from lift3d.config import load_config
    from lift3d.data.normalize import transform_poses
    from lift3d.data.sample_scene import render_toy
    from lift3d.recipes import recipe_config
    from lift3d.runs.run_dirs import load_system
    from lift3d.runs.runner import run_experiment

    root, module = one_sided
    config = recipe_config("reconstruct-gaussians-sample")
    overrides = [f"output_root={tmp_path}", f"data.root={root}", "use_timestamp=false", "trainer.enable_progress_bar=false",
                 "trainer.max_steps=120", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
                 "system.gaussians.init_points=1500", "system.densify.refine_start=1000", "system.export.formats=[]",
                 "checkpoint.every_n_minutes=0"]
    cfg = load_config(config, overrides=overrides)
    run_dir = run_experiment("train", cfg, [config], [])
    system = load_system(cfg, run_dir / "ckpts" / "last.ckpt").eval()
    cameras = module.video_cameras(12)
    with torch.no_grad():
        alpha = system.render_views({"cameras": cameras})["alpha"][..., 0]
    # the same cameras in the toy's own frame (the capture was normalized for training)
    toy_c2w = transform_poses(np.linalg.inv(module.normalization), cameras.c2w.double().numpy())
    toy = render_toy(Cameras(torch.tensor(toy_c2w, dtype=torch.float32), cameras.intrinsics, cameras.width, cameras.height))
    subject = toy[..., 3] > 0.5
    assert bool((subject.flatten(1).float().mean(1) > 0.1).all())  # the toy is well in view in every frame
    covered = torch.stack([(a[m] > 0.5).float().mean() for a, m in zip(alpha, subject)])
    assert float(covered.min()) > 0.8, covered  # the fit covers at least 80% of the toy's pixels in every frame
