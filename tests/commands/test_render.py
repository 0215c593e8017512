"""``lift3d render`` without a browser: a turn around a model (--orbit), a smooth path through a run's training cameras
(--path-through-cameras), and the command the viewer prints for a saved path naming the real run or file."""

import math

import imageio.v3 as iio
import numpy as np
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.cli import main
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.runs.runner import run_experiment
from lift3d.viewer.path import camera_path_through, orbit_path, walk_order
from lift3d.viewer.server import render_command
from tests.viewer_scene import write_gaussian_ply


def _cameras(positions: torch.Tensor, width: int = 40, height: int = 30) -> Cameras:
    c2w = look_at(positions, torch.zeros_like(positions), torch.tensor([0.0, 0.0, 1.0]).expand_as(positions))
    return Cameras(c2w, intrinsics_from_fovy(torch.full((len(positions),), math.radians(45.0)), width, height), width, height)


def test_an_orbit_turns_once_around_the_look_at_point_from_the_home_camera():
    cameras = orbit_path(((3.0, 0.0, 1.0), (0.0, 0.0, 0.2)), 8, 32, 24)
    positions = cameras.c2w[:, :3, 3].double()
    assert torch.allclose(positions[0], torch.tensor([3.0, 0.0, 1.0], dtype=torch.float64), atol=1e-5)
    assert torch.allclose(positions[:, 2], torch.full((8,), 1.0, dtype=torch.float64), atol=1e-5)  # its elevation kept
    offsets = positions - torch.tensor([0.0, 0.0, 0.2], dtype=torch.float64)
    assert torch.allclose(offsets.norm(dim=-1), offsets[0].norm().expand(8), atol=1e-5)  # its distance kept
    assert torch.allclose(positions[4, :2], torch.tensor([-3.0, 0.0], dtype=torch.float64), atol=1e-5)  # half a turn
    assert (cameras.width, cameras.height) == (32, 24)
    higher = orbit_path(((3.0, 0.0, 1.0), (0.0, 0.0, 0.0)), 4, 16, 16, elevation_deg=60.0)
    elevation = math.degrees(math.asin(float(higher.c2w[0, 2, 3]) / float(higher.c2w[0, :3, 3].norm())))
    assert abs(elevation - 60.0) < 1e-3


def test_a_walk_visits_neighbors_in_turn():
    line = torch.tensor([[0.0, 0, 0], [3, 0, 0], [1, 0, 0], [4, 0, 0], [2, 0, 0]])
    assert walk_order(line) == [0, 2, 4, 1, 3]


def test_the_path_passes_through_every_camera_of_a_small_capture_in_walking_order():
    azimuths = torch.tensor([0.0, 90.0, 30.0, 60.0])  # taken out of order: the path walks 0, 30, 60, 90 degrees
    positions = torch.stack([3 * torch.cos(torch.deg2rad(azimuths)), 3 * torch.sin(torch.deg2rad(azimuths)),
                             torch.ones(4)], -1)
    cameras = _cameras(positions)
    path = camera_path_through(cameras, 10)  # 3 segments of 3 frames: keyframes at frames 0, 3, 6, 9
    assert (path.width, path.height, len(path)) == (40, 30, 10)
    for frame, camera in zip((0, 3, 6, 9), (0, 2, 3, 1)):
        assert torch.allclose(path.c2w[frame], cameras.c2w[camera], atol=1e-4), (frame, camera)
    steps = (path.c2w[1:, :3, 3] - path.c2w[:-1, :3, 3]).norm(dim=-1)
    assert steps.max() < 2.5 * steps.min()  # smooth: no jumps between frames
    assert torch.allclose(path.intrinsics, cameras.intrinsics[:1].expand(10, 3, 3), atol=1e-3)


def test_orbit_of_a_gaussian_file_and_a_clear_error_for_cameras_it_does_not_have(tmp_path, capsys):
    ply = write_gaussian_ply(tmp_path / "g.ply")
    assert main(["render", str(ply), "--orbit", "--frames", "6", "--width", "32", "--height", "24", "--device", "cpu"]) == 0
    out = tmp_path / "g-orbit.mp4"  # beside the file, named as export names its turntable
    assert f"rendered 6 frames to {out}" in capsys.readouterr().out
    frames = np.stack(list(iio.imiter(out)))
    assert frames.shape == (6, 24, 32, 3)
    assert all(frame.std() > 5 for frame in frames)  # the object is in every frame (framed as the viewer frames it)
    assert np.abs(frames[0].astype(float) - frames[3]).mean() > 1  # and the camera turns
    assert main(["render", str(ply), "--path-through-cameras", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "has no training cameras" in err and "--orbit" in err and "Traceback" not in err
    assert main(["render", str(ply), "--orbit", "--frames", "0"]) == 2
    assert "--frames must be a positive number" in capsys.readouterr().err


def test_a_run_renders_through_its_training_cameras_into_its_save_folder(tmp_path, capsys):
    overrides = [f"output_root={tmp_path}", "use_timestamp=false", "tag=run", "trainer.enable_progress_bar=false",
                 "trainer.max_steps=2", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
                 "system.gaussians.init_points=300", "system.export.formats=[]"]
    config = recipe_config("reconstruct-gaussians-sample")
    run_dir = run_experiment("train", load_config(config, overrides=overrides), [config], overrides)
    assert main(["render", str(run_dir), "--path-through-cameras", "--frames", "5", "--device", "cpu"]) == 0
    out = run_dir / "save" / "render-cameras.mp4"
    assert f"rendered 5 frames to {out}" in capsys.readouterr().out
    assert np.stack(list(iio.imiter(out))).shape == (5, 64, 64, 3)  # the sample scene's photos are 64 x 64
    assert main(["render", str(run_dir), "--orbit", "--frames", "3", "--width", "16", "--device", "cpu"]) == 0
    assert np.stack(list(iio.imiter(run_dir / "save" / "render-orbit.mp4"))).shape == (3, 16, 16, 3)


def test_the_viewer_names_the_real_run_in_the_render_command(tmp_path):
    run = tmp_path / "outputs" / "reconstruct-gaussians" / "my scene@20260101-000000"
    command = render_command(run, run / "path.json")
    assert command == f"lift3d render '{run}' --path '{run}/path.json'" and "RUN" not in command
