"""The viewer on CPU without a browser: render modes of a Gaussian file and a mesh, a recorded path rendered to an
mp4 (frame count, frames differ), the training callback (added only with --viewer; pause holds the step counter;
renders from the training model), and the CLI's errors."""

import math
import threading
import time

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from lift3d.cameras import look_at
from lift3d.cli import main
from lift3d.commands.common import training_callbacks
from lift3d.config import load_config
from lift3d.data.sample_scene import sample_scene_path
from lift3d.recipes import recipe_config
from lift3d.runs.runner import build_parts, build_trainer
from lift3d.viewer.camera_math import c2w_to_viser_pose, viewer_cameras
from lift3d.viewer.models import RENDER_MODES, load_view_model, render_picture
from lift3d.viewer.path import CameraPath, Keyframe, save_camera_path
from tests.viewer_scene import write_gaussian_ply


def _camera(azimuth_deg: float, distance: float = 3.0, height: float = 1.0) -> torch.Tensor:
    a = math.radians(azimuth_deg)
    position = torch.tensor([distance * math.cos(a), distance * math.sin(a), height])
    return look_at(position, torch.zeros(3), torch.tensor([0.0, 0, 1]))


def test_every_render_mode_of_a_gaussian_file_shows_the_object(tmp_path):
    model = load_view_model(write_gaussian_ply(tmp_path / "g.ply"))
    cams = viewer_cameras(_camera(0), math.radians(50), 48, 32)
    pictures = {mode: render_picture(model, cams, mode, "cpu") for mode in RENDER_MODES}
    for mode, picture in pictures.items():
        assert picture.shape == (32, 48, 3) and picture.dtype == np.uint8
        center, corner = picture[12:20, 20:28].astype(float).mean(), picture[:4, :4].astype(float).mean()
        assert center > corner + 20, f"{mode}: the object does not stand out ({center:.0f} vs {corner:.0f})"
    for a, b in (("rgb", "depth"), ("rgb", "normal"), ("depth", "alpha")):
        assert np.abs(pictures[a].astype(int) - pictures[b].astype(int)).mean() > 5, f"{a} and {b} look the same"


def test_a_mesh_renders_with_its_own_normals(tmp_path):
    import trimesh

    path = tmp_path / "box.glb"
    trimesh.creation.box(extents=(1.0, 1.0, 1.0)).export(path)
    model = load_view_model(path)
    cams = viewer_cameras(_camera(30), math.radians(50), 32, 32)
    out = model.render_fn(cams)
    assert "normal" in out and float(out["alpha"].mean()) > 0.05
    normal = render_picture(model, cams, "normal", "cpu")
    assert len(np.unique(normal[out["alpha"][0, ..., 0].numpy() > 0.5].reshape(-1, 3), axis=0)) >= 2  # faces differ


def test_recorded_path_renders_to_an_mp4_with_the_right_frame_count(tmp_path, capsys):
    ply = write_gaussian_ply(tmp_path / "g.ply")
    keys = [Keyframe(_camera(0).tolist(), 50.0), Keyframe(_camera(120, distance=2.5).tolist(), 40.0)]
    path = save_camera_path(tmp_path / "path.json", CameraPath(keys, fps=8, seconds=1.25, width=32, height=24))
    out = tmp_path / "video.mp4"
    assert main(["render", str(ply), "--path", str(path), "--out", str(out), "--device", "cpu"]) == 0
    assert f"rendered 10 frames to {out}" in capsys.readouterr().out
    frames = np.stack(list(iio.imiter(out)))
    assert frames.shape == (10, 24, 32, 3)
    first, last = frames[0].astype(float), frames[-1].astype(float)
    assert np.abs(first - last).mean() > 3, "the first and last frames of a moving camera should differ"
    assert min(np.abs(frames[i + 1].astype(float) - frames[i]).mean() for i in range(9)) > 0.1  # every frame moves


def test_render_and_view_errors_are_one_line(tmp_path, capsys):
    ply = write_gaussian_ply(tmp_path / "g.ply")
    assert main(["render", str(ply), "--path", str(tmp_path / "missing.json")]) == 2
    assert "camera path not found" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"keyframes": []}')
    assert main(["render", str(ply), "--path", str(tmp_path / "bad.json")]) == 2
    assert "no keyframes" in capsys.readouterr().err
    assert main(["view", str(tmp_path / "nothing.ply")]) == 2
    assert "nothing to view" in capsys.readouterr().err
    (tmp_path / "model.xyz").write_text("x")
    assert main(["view", str(tmp_path / "model.xyz")]) == 2
    assert "cannot view" in capsys.readouterr().err


def _tiny_run(tmp_path, viewer: bool, steps: int):
    overrides = [f"data.root={sample_scene_path()}", f"output_root={tmp_path}", "use_timestamp=false",
                 "trainer.enable_progress_bar=false", f"trainer.max_steps={steps}", "trainer.val_check_interval=0",
                 "trainer.run_test_after_fit=false", "checkpoint.every_n_train_steps=0", "checkpoint.save_last=false",
                 "system.gaussians.init_points=300", "system.export.formats=[]", f"viewer.enabled={str(viewer).lower()}",
                 "viewer.port=0", "viewer.max_side=32", "viewer.preview_max_side=16"]
    cfg = load_config(recipe_config("reconstruct-gaussians-sample"), overrides=overrides)
    run_dir = tmp_path / "run"
    return cfg, build_trainer(cfg, run_dir, train=True, callbacks=training_callbacks(cfg, run_dir)), run_dir


def test_the_viewer_callback_exists_only_with_the_flag(tmp_path):
    from lift3d.viewer.training import ViewerCallback

    _, trainer, _ = _tiny_run(tmp_path, viewer=False, steps=1)
    assert not any(isinstance(c, ViewerCallback) for c in trainer.callbacks)
    _, trainer, _ = _tiny_run(tmp_path, viewer=True, steps=1)
    assert sum(isinstance(c, ViewerCallback) for c in trainer.callbacks) == 1


@pytest.mark.slow
def test_pause_holds_the_training_loop_and_the_page_still_renders(tmp_path):
    from lift3d.viewer.training import ViewerCallback

    steps = 40
    cfg, trainer, _ = _tiny_run(tmp_path, viewer=True, steps=steps)
    viewer = next(c for c in trainer.callbacks if isinstance(c, ViewerCallback))
    seen: dict[str, object] = {}

    def drive() -> None:
        try:
            deadline = time.monotonic() + 120
            while (viewer.server is None or trainer.global_step < 3) and time.monotonic() < deadline:
                time.sleep(0.01)
            wxyz, position = c2w_to_viser_pose(_camera(40, distance=4.0).double())
            viewer.server.set_camera(7, wxyz.numpy(), position.numpy(), math.radians(50), 64, 48)  # a page's camera
            viewer.server.set_paused(True)
            time.sleep(0.5)  # the step under way finishes
            seen["paused_at"] = trainer.global_step
            seen["label"] = viewer.server.pause_button.label
            time.sleep(1.5)
            seen["after_wait"] = trainer.global_step
            seen["stats"] = viewer.stats_line(trainer, trainer.lightning_module)
            seen["renders_while_paused"] = viewer.renders
            viewer.server.set_paused(False)
        except Exception as error:  # noqa: BLE001  (reported by the main thread's asserts)
            seen["error"] = repr(error)
            if viewer.server is not None:
                viewer.server.set_paused(False)

    datamodule, system = build_parts(cfg)
    thread = threading.Thread(target=drive, daemon=True)
    thread.start()
    trainer.fit(system, datamodule=datamodule)
    thread.join(10)
    assert "error" not in seen, seen
    assert 3 <= seen["paused_at"] < steps, seen
    assert seen["after_wait"] == seen["paused_at"], f"the step counter moved while paused: {seen}"
    assert seen["label"] == "Resume training" and "paused" in seen["stats"] and "Gaussians" in seen["stats"]
    assert seen["renders_while_paused"] >= 2  # the page's view, small then full, rendered from the paused model
    assert trainer.global_step == steps  # resumed and finished
    assert viewer.server is None  # stopped with the run


@pytest.mark.parametrize("recipe, extra", [
    ("reconstruct-gaussians-sample", ["system.gaussians.init_points=300"]),
    pytest.param("reconstruct-nerf-cpu", [], marks=pytest.mark.slow),
])
def test_view_model_of_a_finished_run_renders_and_has_its_training_cameras(tmp_path, recipe, extra):
    from lift3d.runs.runner import run_experiment

    overrides = [f"data.root={sample_scene_path()}", f"output_root={tmp_path}", "use_timestamp=false", "trainer.max_steps=3",
                 "trainer.enable_progress_bar=false", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
                 "checkpoint.every_n_train_steps=0", "system.export.formats=[]", *extra]
    run_dir = run_experiment("train", load_config(recipe_config(recipe), overrides=overrides))
    model = load_view_model(run_dir)
    assert model.training_views is not None and len(model.training_views.cameras) == len(model.training_views.thumbnails) > 0
    assert model.training_views.thumbnails[0].dtype == np.uint8 and model.training_views.thumbnails[0].shape[-1] == 3
    cams = viewer_cameras(_camera(10, distance=4.0), math.radians(40), 24, 16)
    pictures = {mode: render_picture(model, cams, mode, "cpu") for mode in RENDER_MODES}
    assert all(p.shape == (16, 24, 3) for p in pictures.values())
    assert np.abs(pictures["rgb"].astype(int) - pictures["depth"].astype(int)).mean() > 1


def test_viewer_flags_become_config_overrides(tmp_path, capsys):
    from lift3d.cli import build_parser
    from lift3d.commands.common import load_experiment, viewer_overrides

    recipe = str(recipe_config("reconstruct-gaussians-sample"))
    args = build_parser().parse_args(["train", recipe, "--viewer", "--viewer-port", "9123", "--viewer-host", "0.0.0.0"])
    cfg, _, _ = load_experiment(args, viewer_overrides(args))
    assert (cfg.viewer.enabled, cfg.viewer.port, cfg.viewer.host, cfg.viewer.max_share) == (True, 9123, "0.0.0.0", 0.1)
    plain = build_parser().parse_args(["train", recipe])
    assert viewer_overrides(plain) == [] and load_experiment(plain)[0].viewer.enabled is False
    for command in (["reconstruct", "--viewer"], ["generate", "a cup", "--viewer"]):
        assert viewer_overrides(build_parser().parse_args(command)) == ["viewer.enabled=true"]
    (tmp_path / "prompts.txt").write_text("a cup\n")
    assert main(["generate", "--prompts", str(tmp_path / "prompts.txt"), "--viewer"]) == 2
    assert "does not go with --prompts" in capsys.readouterr().err


@pytest.mark.slow
def test_renders_of_a_moving_camera_stay_within_their_share_of_training_time(tmp_path):
    from lift3d.viewer.training import ViewerCallback

    cfg, trainer, _ = _tiny_run(tmp_path, viewer=True, steps=60)
    viewer = next(c for c in trainer.callbacks if isinstance(c, ViewerCallback))
    viewer.cfg.max_share = 0.05
    done = threading.Event()

    def move() -> None:  # a browser whose camera never stops: every step could render
        angle = 0.0
        while not done.is_set():
            server = viewer.server  # read once: the callback drops its server when training ends
            if server is not None:
                wxyz, position = c2w_to_viser_pose(_camera(angle, distance=4.0).double())
                server.set_camera(3, wxyz.numpy(), position.numpy(), math.radians(50), 640, 480)
                angle += 2.0
            time.sleep(0.005)

    thread = threading.Thread(target=move, daemon=True)
    thread.start()
    datamodule, system = build_parts(cfg)
    try:
        trainer.fit(system, datamodule=datamodule)
    finally:
        done.set()
        thread.join(timeout=10)
    end = time.perf_counter()
    budget = viewer.budget
    assert viewer.renders >= 2, "a moving camera should have been rendered"
    # renders start only while spent <= share x training time so far: at most one render over the share
    assert budget.spent <= 0.05 * (end - budget.start) + viewer.longest_render, (budget.spent, end - budget.start)
    assert budget.spent < 0.5 * (end - budget.start), "the viewer took most of the training time"
