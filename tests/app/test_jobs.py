"""The app's job queue with real ``lift3d train`` subprocesses: one at a time, export, cancel, failures."""

import os
import time
from pathlib import Path

import numpy as np
import pytest

from lift3d.app.jobs import CANCELLED, FAILED, FINISHED, QUEUED, RUNNING, Job, JobQueue, JobSpec
from lift3d.app.results import error_from_log, result_files
from lift3d.app.views import format_duration, job_view, status_html
from lift3d.checkpoints import load_checkpoint
from tests.conftest import TEST_CONFIGS

APP_MESH = TEST_CONFIGS / "app-mesh.yaml"
FAST = ["system.step_sleep_s=0.0", "trainer.run_test_after_fit=false", "trainer.val_check_interval=0"]


@pytest.fixture
def queue():
    q = JobQueue(["cpu"], poll_s=0.1, cancel_grace_s=20.0)
    yield q
    q.close(timeout=60)


def _spec(tmp_path: Path, overrides: list[str], title: str = "a test", export: bool = False) -> JobSpec:
    return JobSpec(APP_MESH, overrides, tmp_path, recipe="test", title=title, export=export,
                   export_formats=["glb"] if export else None)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_job_trains_then_exports_its_asset(queue, tmp_path):
    job = queue.submit(_spec(tmp_path, ["trainer.max_steps=20", "system.step_sleep_s=0.02", "trainer.val_check_interval=10"],
                             title="A red: apple!", export=True))
    _wait_for(lambda: job.state != QUEUED, 60, "the job to start")
    if job.active:
        assert queue.latest() is job  # a fresh page with no job id finds the running job
    queue.wait(job.id, timeout=300)
    assert job.state == FINISHED, job.error
    assert job.run_dir.parent == tmp_path / "app-mesh" and job.run_dir.name.startswith("a-red-apple-")
    assert job.progress["status"] == "finished" and job.progress["step"] == 20
    assert job.progress["latest_image"].endswith(".png") and "it20-val" in job.progress["latest_image"]
    results = job.results()
    assert results.model is not None and results.model.name == "sphere.glb"
    assert results.video is not None and results.video.name == "it20-test.mp4"
    assert set(results.files) == {results.model, results.video}
    import trimesh

    mesh = trimesh.load(results.model, force="mesh")
    assert len(mesh.vertices) == 642 and np.asarray(mesh.visual.vertex_colors)[:, :3].std(axis=0).min() > 5
    assert queue.latest() is job  # with nothing running, the newest job


def test_cancel_keeps_the_last_checkpoint_and_queued_jobs_never_start(queue, tmp_path):
    long = queue.submit(_spec(tmp_path, ["trainer.max_steps=100000", "checkpoint.every_n_train_steps=10",
                                         "system.step_sleep_s=0.02", "trainer.val_check_interval=0"]))
    waiting = queue.submit(_spec(tmp_path, ["trainer.max_steps=10", *FAST]))
    _wait_for(lambda: long.progress.get("step", 0) >= 25, 120, "the long job to pass step 25")
    assert queue.cancel(waiting.id) and waiting.state == CANCELLED and waiting.started is None
    assert queue.latest() is long
    assert queue.cancel(long.id)
    queue.wait(long.id, timeout=60)
    assert long.state == CANCELLED and long.progress["status"] == "interrupted"
    checkpoint = load_checkpoint(long.run_dir / "ckpts" / "last.ckpt")
    assert checkpoint["global_step"] >= 20  # a periodic checkpoint (every 10), or one written as the run stopped
    assert checkpoint["global_step"] <= long.progress["step"] < 100000
    step, kept = long.progress["step"], checkpoint["global_step"]  # the note names the checkpoint and its step
    assert long.note.startswith(f"canceled at step {step}; kept ckpts/last.ckpt (step {kept})"), long.note
    assert not queue.cancel(long.id)  # nothing left to cancel
    time.sleep(0.3)
    assert waiting.started is None and waiting.run_dir is None


def test_failures_surface_their_error_and_the_queue_goes_on(queue, tmp_path):
    nan = queue.submit(_spec(tmp_path, ["system.nan_at_step=3", *FAST]))
    unreachable = queue.submit(_spec(tmp_path, [
        "system.fail_on_build='could not load model stabilityai/sd-2-1-base: not reachable offline'", *FAST]))
    _wait_for(lambda: nan.state != QUEUED, 60, "the first run to leave the queue")
    assert unreachable.state == QUEUED and queue.position(unreachable) == 1
    most_running, deadline = 0, time.monotonic() + 300  # one CPU slot: never two runs at once
    while nan.ended is None or unreachable.ended is None:
        assert time.monotonic() < deadline, "timed out waiting for the failing runs"
        most_running = max(most_running, sum(j.state == RUNNING for j in (nan, unreachable)))
        time.sleep(0.02)
    assert most_running == 1
    assert nan.state == FAILED and nan.error.startswith("NonFiniteLossError: the loss is not finite at step 3")
    assert nan.progress["status"] == "failed"
    # the second run still ran, and died before training started: set aside (no checkpoint), its error in progress.json
    assert unreachable.state == FAILED and unreachable.started >= nan.ended
    assert unreachable.progress["status"] == "failed" and ".failed" in unreachable.progress["run_dir"]
    assert "could not load model stabilityai/sd-2-1-base: not reachable offline" in unreachable.error
    html = status_html(job_view(nan))
    assert 'data-state="failed"' in html and "NonFiniteLossError" in html


def test_error_from_log_prefers_lift3d_errors(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("noise\nlift3d: error: unknown config key 'system.x'\nmore noise\n")
    assert error_from_log(log) == "unknown config key 'system.x'"
    log.write_text("Traceback (most recent call last):\n  File x\nRuntimeError: boom\n\n")
    assert error_from_log(log) == "RuntimeError: boom"
    assert error_from_log(tmp_path / "missing.log") is None


def test_result_files_pick_the_viewer_asset_and_the_latest_video(tmp_path):
    save = tmp_path / "save"
    for name in ["it100-val/0000.png", "it100-test/0000.png", "it100-test.mp4", "it900-test.mp4", "metrics.json",
                 "export/model.obj", "export/model.mtl", "export/texture.png", "splat.ply", "mesh.glb"]:
        (save / name).parent.mkdir(parents=True, exist_ok=True)
        (save / name).write_bytes(b"x")
    results = result_files(tmp_path)
    assert results.model == save / "mesh.glb" and results.video == save / "it900-test.mp4"
    assert sorted(p.relative_to(save).as_posix() for p in results.files) == [
        "export/model.mtl", "export/model.obj", "export/texture.png", "it100-test.mp4", "it900-test.mp4", "mesh.glb", "splat.ply"]
    (save / "mesh.glb").unlink()
    assert result_files(tmp_path).model == save / "splat.ply"  # a Gaussian splat .ply when there is no .glb
    assert result_files(tmp_path / "nothing").files == []


def test_job_view_reports_step_loss_rate_and_eta(tmp_path):
    job = Job("abc", _spec(tmp_path, [], title="<b>cat</b>"), tag="t", state=RUNNING, device="cpu")
    job.progress = {"step": 15, "max_steps": 60, "loss": 0.012345, "steps_per_second": 3.0, "eta_seconds": 15.0,
                    "latest_image": os.devnull}
    view = job_view(job)
    assert view.stats == "step 15 / 60 · loss 0.01235 · 3 steps/s · ETA 0:15" and view.fraction == 0.25
    assert view.headline == "Training on cpu: <b>cat</b>" and view.latest_image is None  # not a file
    html = status_html(view)
    assert "&lt;b&gt;cat&lt;/b&gt;" in html and 'data-step="15"' in html and 'value="25.0"' in html
    assert format_duration(3725) == "1:02:05" and format_duration(None) == "--:--"


def test_photos_without_poses_get_them_before_training(queue, tmp_path):
    """A job for an upload without poses runs `lift3d poses` first, then trains on the scene it made."""
    from lift3d.recipes import recipe_config
    from tests.sfm_scene import write_photos

    scene = tmp_path / "upload"
    write_photos(scene / "images", n_views=20, resolution=200)
    spec = JobSpec(recipe_config("reconstruct-gaussians-cpu"), [f"data.root={scene}", "trainer.max_steps=4", *FAST[1:],
                                                                 "system.gaussians.sh_degree=0"],
                   tmp_path / "runs", recipe="photos", title="my photos", export=False, poses_from=str(scene))
    job = queue.submit(spec)
    queue.wait(job.id, timeout=600)
    assert job.state == FINISHED, job.error
    assert (scene / "sparse" / "0" / "images.bin").is_file() and job.progress["step"] == 4
    assert (job.run_dir / "configs" / "scene.json").is_file()
