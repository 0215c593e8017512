"""The web app's action on a finished reconstruction: ``lift3d edit`` queued from the page (checks without a
browser) and run by the job queue in a subprocess."""

from __future__ import annotations

import html

import pytest

from lift3d.app.jobs import FINISHED, RUNNING, Job, JobQueue, JobSpec
from lift3d.app.recipes import PHOTOS, PROMPT, AppRecipe, probe_recipe
from lift3d.app.ui import AppState
from lift3d.cli import main
from lift3d.recipes import recipe_config
from tests.app.test_page import FakeQueue

QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false", "data.n_orbit_views=2"]


@pytest.fixture(scope="module")
def reconstruction(tmp_path_factory):
    root = tmp_path_factory.mktemp("app-edit")
    assert main(["reconstruct", f"output_root={root}", "trainer.max_steps=5", "trainer.val_check_interval=0",
                 "system.gaussians.init_points=500", *QUIET]) == 0
    return root / "reconstruct-gaussians-sample" / "sample_scene"


@pytest.fixture(scope="module")
def recipes():
    photos = AppRecipe("Photos", ("reconstruct-gaussians",), input=PHOTOS, input_keys=("data.root",))
    text = AppRecipe("Text", ("gaussian-sds",), input=PROMPT)
    return [probe_recipe(photos), probe_recipe(text)]


def _finished(queue, label, run_dir, state=FINISHED, owner="") -> str:
    job = Job(f"done{len(queue.known)}", JobSpec(recipe_config("reconstruct-gaussians"), [], run_dir.parent, recipe=label,
                                                 owner=owner), tag="t", state=state, run_dir=run_dir)
    queue.known[job.id] = job
    return job.id


def test_the_page_queues_an_edit_of_a_finished_reconstruction(recipes, reconstruction, tmp_path):
    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path)
    owner = state.new_owner()
    assert "finished reconstruction" in html.unescape(state.edit(owner, None, "make it bronze")[1])
    running = _finished(queue, "Photos", reconstruction, state=RUNNING, owner=owner)
    assert "finished reconstruction" in html.unescape(state.edit(owner, running, "make it bronze")[1])
    text_job = _finished(queue, "Text", reconstruction, owner=owner)
    assert "is not a reconstruction" in html.unescape(state.edit(owner, text_job, "make it bronze")[1])
    done = _finished(queue, "Photos", reconstruction, owner=owner)
    assert "type an edit instruction" in html.unescape(state.edit(owner, done, "   ")[1])
    # another page's session cannot edit this run (it does not see it)
    assert "finished reconstruction" in html.unescape(state.edit(state.new_owner(), done, "make it bronze")[1])
    assert not queue.submitted
    job_id, message = state.edit(owner, done, " make it  bronze ", "analytic")
    assert job_id == "job0", message
    spec = queue.submitted[0]
    assert spec.edit_of == str(reconstruction) and spec.title == "make it bronze" and spec.editor == "analytic"
    assert spec.recipe == "Edit of Photos" and spec.owner == owner


@pytest.mark.slow
def test_the_queue_runs_lift3d_edit_on_the_run(reconstruction, tmp_path):
    queue = JobQueue(["cpu"], poll_s=0.1)
    try:
        spec = JobSpec(reconstruction / "configs" / "parsed.yaml", ["trainer.max_steps=4", "system.edit_every=2", *QUIET],
                       tmp_path, recipe="Edit of Photos", title="make it bronze", export=False, edit_of=str(reconstruction),
                       editor="analytic")
        job = queue.submit(spec)
        queue.wait(job.id, timeout=300)
    finally:
        queue.close(timeout=60)
    assert job.state == FINISHED, job.error
    assert job.run_dir.parent == tmp_path / "reconstruct-gaussians-sample" and job.progress["step"] == 4
    assert (job.run_dir / "save" / "it4-gaussians.ply").is_file() and (job.run_dir / "save" / "edits").is_dir()
    assert job.results().model is not None
