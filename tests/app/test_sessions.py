"""Whose job is whose: with the app bound beyond localhost, a page session (its owner token) sees, cancels and
downloads only what it started, driven through the handlers the page binds (no browser). Cancel says what the
run kept, read from its ckpts/."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pytest

from lift3d.app.jobs import CANCELLED, FINISHED, QUEUED, RUNNING, Job, JobQueue, JobSpec
from lift3d.app.recipes import AppRecipe, probe_recipe
from lift3d.app.results import checkpoint_step, kept_checkpoint
from lift3d.app.ui import AppState, is_private
from tests.app.test_page import NO_OPTIONS, FakeQueue
from tests.conftest import TEST_CONFIGS
from tests.processes import stop

LABEL = "Sphere from text"
SLOW = ("system.step_sleep_s=0.05", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false")


@pytest.fixture(scope="module")
def recipes():
    entry = AppRecipe(LABEL, (str(TEST_CONFIGS / "app-mesh.yaml"),), input_keys=("system.prompt",),
                      options={"steps": ("trainer.max_steps",)}, overrides=SLOW, export=False)
    return [probe_recipe(entry)]


def _text(result) -> str:
    return html.unescape(result if isinstance(result, str) else result[1])


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _assert_tells_what_was_kept(message: str, run_dir) -> None:
    """The message names the newest checkpoint in ckpts/ and its real step, or says none was kept when there is none."""
    kept = kept_checkpoint(run_dir)
    if kept is None:
        assert "no checkpoint was kept" in message, message
        assert not list((run_dir / "ckpts").glob("*.ckpt")) if (run_dir / "ckpts").is_dir() else True
        return
    match = re.search(r"kept ckpts/(\S+) \(step (\d+)\)", message)
    assert match, message
    named = run_dir / "ckpts" / match.group(1)
    assert named.is_file() and checkpoint_step(named) == int(match.group(2)) == kept[1]


def test_a_second_session_neither_sees_nor_cancels_the_first_ones_job(recipes, tmp_path):
    queue = JobQueue(["cpu"], poll_s=0.1, cancel_grace_s=30.0)
    state = AppState(queue, recipes, tmp_path, private=True, publish_root=tmp_path / "published", cancel_wait_s=60.0)
    try:
        alice, nothing, _ = state.attach(None, None)
        assert alice and nothing is None
        job_id, message = state.start(alice, None, LABEL, "a cat", None, "100000", *NO_OPTIONS[1:])
        assert 'data-kind="info"' in message, message
        job = queue.get(job_id)
        _wait_for(lambda: job.state == RUNNING and job.progress.get("step", 0) >= 3, 120, "the first steps")

        bob, seen, _ = state.attach(None, None)  # a second browser, no job id of its own
        assert bob != alice and seen is None
        assert state.attach(bob, job_id) == (bob, None, {})  # knowing the id does not help
        forged, seen, _ = state.attach("a-made-up-token", job_id)  # nor does a token the server never issued
        assert forged != "a-made-up-token" and seen is None
        *updates, shown = state.refresh(bob, job_id, {})
        assert shown["job"] is None and 'data-state="idle"' in updates[0]["value"] and updates[5]["interactive"] is False
        assert "there is no queued or running job" in _text(state.cancel(bob, job_id))
        assert "finished reconstruction" in _text(state.edit(bob, job_id, "make it bronze"))
        assert state.start(None, None, LABEL, "a dog", None, *NO_OPTIONS)[1].count("reload the page") == 1
        time.sleep(1.0)
        assert job.active and not job.cancel_event.is_set()  # Bob's cancel did nothing

        assert state.attach(alice, None)[1] == job_id  # Alice's own page finds it again after a reload
        *updates, shown = state.refresh(alice, job_id, {})
        assert shown["job"] == job_id and f'data-job="{job_id}"' in updates[0]["value"]
        message = _text(state.cancel(alice, job_id))  # Alice can: it says what the run kept
        assert job.state == CANCELLED and f"Run {job_id} canceled at step" in message, message
        _assert_tells_what_was_kept(message, job.run_dir)
        assert "its last checkpoint stays" not in message
    finally:
        queue.close(timeout=60)


def test_cancel_names_the_checkpoint_kept_and_its_step(recipes, tmp_path):
    queue = JobQueue(["cpu"], poll_s=0.1, cancel_grace_s=30.0)
    state = AppState(queue, recipes, tmp_path, private=False, cancel_wait_s=60.0)
    try:
        owner = state.new_owner()
        job_id, _ = state.start(owner, None, LABEL, "a cat", None, "100000", *NO_OPTIONS[1:])
        job = queue.get(job_id)
        job.spec.overrides.append("checkpoint.every_n_train_steps=5")  # read when the job starts: it is still queued
        _wait_for(lambda: job.progress.get("step", 0) >= 12, 120, "two periodic checkpoints")
        message = _text(state.cancel(owner, job_id))
        assert job.state == CANCELLED and "kept ckpts/" in message, message
        _assert_tells_what_was_kept(message, job.run_dir)
        assert kept_checkpoint(job.run_dir)[1] >= 10 and job.note in message
        assert "there is no queued or running job" in _text(state.cancel(owner, job_id))
    finally:
        queue.close(timeout=60)


def test_kept_checkpoint_reads_steps_and_prefers_last_on_a_tie(tmp_path):
    import torch

    ckpts = tmp_path / "run" / "ckpts"
    assert kept_checkpoint(tmp_path / "run") is None
    ckpts.mkdir(parents=True)
    (ckpts / "broken.ckpt").write_bytes(b"half a checkpoint")  # unreadable: not counted as kept
    assert kept_checkpoint(tmp_path / "run") is None
    torch.save({"global_step": 500}, ckpts / "step0000500.ckpt")
    torch.save({"global_step": 500}, ckpts / "last.ckpt")
    assert kept_checkpoint(tmp_path / "run") == (ckpts / "last.ckpt", 500)
    torch.save({"global_step": 730}, ckpts / "interrupted.ckpt")
    assert kept_checkpoint(tmp_path / "run") == (ckpts / "interrupted.ckpt", 730)


def test_downloads_are_handed_only_to_the_owner_under_unguessable_names(recipes, tmp_path):
    run_dir = tmp_path / "outputs" / "app-mesh" / "run"
    (run_dir / "save").mkdir(parents=True)
    (run_dir / "save" / "sphere.glb").write_bytes(b"glTF mesh")
    (run_dir / "save" / "it20-test.mp4").write_bytes(b"video")
    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path / "outputs", publish_root=tmp_path / "published")
    alice, bob = state.new_owner(), state.new_owner()
    job = Job("done0", JobSpec(TEST_CONFIGS / "app-mesh.yaml", [], tmp_path / "outputs", recipe=LABEL, owner=alice),
              tag="t", state=FINISHED, run_dir=run_dir)
    queue.known[job.id] = job
    *updates, shown = state.refresh(alice, job.id, {})
    model, files = shown["model"], shown["files"]
    assert model is not None and model.startswith(str(tmp_path / "published")) and model.endswith("/sphere.glb")
    assert sorted(p.rsplit("/", 1)[1] for p in files) == ["it20-test.mp4", "sphere.glb"]
    assert Path(model).read_bytes() == b"glTF mesh" and updates[2]["value"] == model
    assert re.fullmatch(r"[0-9a-f]{32}", model.split("/")[-2])  # keyed by a server secret, not by the path
    assert AppState(queue, recipes, tmp_path / "outputs", publish_root=tmp_path / "p2").publish(run_dir / "save" / "sphere.glb") \
        .split("/")[-2] != model.split("/")[-2]
    *_, shown = state.refresh(bob, job.id, {})
    assert shown["model"] is None and shown["files"] == [] and shown["job"] is None


def test_the_app_is_private_beyond_localhost():
    assert not is_private("127.0.0.1") and not is_private("localhost") and not is_private("::1")
    assert is_private("0.0.0.0") and is_private("192.168.1.5") and is_private("myhost.lan") and is_private("::")
    assert is_private("127.0.0.1", share=True)


def test_the_server_does_not_serve_the_output_folder(tmp_path):
    """``gradio_api/file=`` used to serve every file under --output-root; now only what a page was handed."""
    import os
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from tests.browser import free_port
    from tests.conftest import REPO

    outputs = tmp_path / "outputs"
    secret = outputs / "someone" / "run@1" / "save" / "it100.glb"
    secret.parent.mkdir(parents=True)
    secret.write_bytes(b"someone else's model")
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "GRADIO_TEMP_DIR": str(tmp_path / "gradio"), "OMP_NUM_THREADS": "1",
           "LIFT3D_APP_RECIPES": ""}
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "lift3d", "app", "--port", str(port), "--output-root", str(outputs),
                                    "--max-upload-gb", "0.5"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/file={secret}", timeout=10)
        assert refused.value.code == 403
        assert "every page sees every job (localhost); uploads up to 0.5 GiB" in log.read_text()
    finally:
        stop(process)


def test_a_run_slow_to_stop_gets_what_it_kept_so_far(recipes, tmp_path):
    import torch

    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path, cancel_wait_s=0.0)
    owner = state.new_owner()
    run_dir = tmp_path / "run"
    job = Job("slow", JobSpec(TEST_CONFIGS / "app-mesh.yaml", [], tmp_path, owner=owner), tag="t", state=RUNNING, run_dir=run_dir)
    job.progress = {"step": 42}
    queue.known[job.id] = job
    message = _text(state.cancel(owner, job.id))  # the fake run never stops
    assert "Stopping run slow at step 42" in message and "so far: no checkpoint was kept" in message, message
    (run_dir / "ckpts").mkdir(parents=True)
    torch.save({"global_step": 40}, run_dir / "ckpts" / "step0000040.ckpt")
    assert "so far: kept ckpts/step0000040.ckpt (step 40)" in _text(state.cancel(owner, job.id))
    job.state = QUEUED
    assert "before it started; nothing was kept" in _text(state.cancel(owner, job.id))
