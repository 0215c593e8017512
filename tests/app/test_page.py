"""The page's handlers without a browser: input checks, the overrides a run gets, reattaching, refresh."""

import html
import zipfile
from pathlib import Path

import gradio as gr
import pytest

from lift3d.app.jobs import FINISHED, RUNNING, Job, JobSpec, job_command
from lift3d.app.recipes import PHOTOS, AppRecipe, probe_recipe
from lift3d.app.ui import AppState
from lift3d.config import load_config
from tests.conftest import TEST_CONFIGS

PROMPT_LABEL, PHOTOS_LABEL = "Sphere from text", "Sphere from photos"
NO_OPTIONS = ("", "", "", "", "")  # steps, seed, resolution, guidance scale, model path left blank


class FakeQueue:
    """Records submitted specs instead of running them."""

    def __init__(self):
        self.submitted: list[JobSpec] = []
        self.known: dict[str, Job] = {}

    def submit(self, spec):
        job = Job(f"job{len(self.submitted)}", spec, tag="t", state=RUNNING, device="cpu")
        self.submitted.append(spec)
        self.known[job.id] = job
        return job

    def position(self, job):
        return 0

    def get(self, job_id):
        return self.known.get(job_id) if job_id else None

    def latest(self, active_only=False):
        return list(self.known.values())[-1] if self.known else None

    def jobs(self):
        return list(self.known.values())

    def cancel(self, job_id):
        return False

    def wait(self, job_id, timeout=None):
        return self.known[job_id]


@pytest.fixture(scope="module")
def recipes():
    text = AppRecipe(PROMPT_LABEL, (str(TEST_CONFIGS / "app-mesh.yaml"),), input_keys=("system.prompt",),
                     options={"steps": ("trainer.max_steps",), "seed": ("seed",)}, export_formats=("glb",))
    photos = AppRecipe(PHOTOS_LABEL, (str(TEST_CONFIGS / "app-mesh-photos.yaml"),), input=PHOTOS, input_keys=("data.root",),
                       options={"steps": ("trainer.max_steps",)})
    return [probe_recipe(text), probe_recipe(photos)]


def _message(result) -> str:
    return html.unescape(result[1])


def test_bad_input_gives_a_message_and_starts_nothing(recipes, tmp_path):
    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path)
    owner = state.new_owner()
    assert "type a prompt" in _message(state.start(owner, None, PROMPT_LABEL, "   ", None, *NO_OPTIONS))
    assert "unknown recipe 'Nope'" in _message(state.start(owner, None, "Nope", "a cat", None, *NO_OPTIONS))
    assert "steps must be a number" in _message(state.start(owner, None, PROMPT_LABEL, "a cat", None, "ten", "", "", "", ""))
    assert "upload photos: a .zip" in _message(state.start(owner, None, PHOTOS_LABEL, "", None, *NO_OPTIONS))
    (tmp_path / "bad.zip").write_bytes(b"junk")
    assert "not a readable .zip" in _message(state.start(owner, None, PHOTOS_LABEL, "", [str(tmp_path / "bad.zip")], *NO_OPTIONS))
    assert queue.submitted == []
    job_id, message = state.start(owner, None, PROMPT_LABEL, "   ", None, *NO_OPTIONS)
    assert job_id == gr.skip() and 'data-kind="error"' in message  # the page keeps its current job


def test_a_prompt_run_gets_the_prompt_and_the_set_options(recipes, tmp_path):
    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path)
    owner = state.new_owner()
    job_id, message = state.start(owner, None, PROMPT_LABEL, "a cat:\n on a mat", None, "12", "", "", "", "")
    assert job_id == "job0" and 'data-kind="info"' in message
    [spec] = queue.submitted
    assert spec.export_formats == ["glb"] and spec.output_root == tmp_path.resolve() and spec.title == "a cat: on a mat"
    cfg = load_config(spec.config, overrides=spec.overrides)
    assert cfg.system["prompt"] == "a cat: on a mat" and cfg.trainer.max_steps == 12 and cfg.seed == 0


def test_a_photos_run_gets_the_unpacked_scene(recipes, tmp_path, data_dir):
    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path / "outputs")
    owner = state.new_owner()
    archive = tmp_path / "lego.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in (data_dir / "lego_tiny").rglob("*"):
            if path.is_file():
                zf.write(path, path.relative_to(data_dir / "lego_tiny"))
    job_id, message = state.start(owner, None, PHOTOS_LABEL, "ignored", [str(archive)], *NO_OPTIONS)
    assert job_id == "job0", message
    cfg = load_config(queue.submitted[0].config, overrides=queue.submitted[0].overrides)
    root = cfg.data["root"]
    uploads = tmp_path / "outputs" / "app-uploads"
    assert root.startswith(str(uploads.resolve())) and uploads.is_dir()
    assert queue.submitted[0].title == "lego.zip (1 train, 1 val views at 50x50)"
    assert load_config(queue.submitted[0].config, overrides=[f"data.root={root}"]).data["root"] == root


def test_a_fresh_page_reattaches_and_refresh_skips_what_did_not_change(recipes, tmp_path):
    """On localhost (not private) any page finds the running job; refresh sends only what changed."""
    queue = FakeQueue()
    state = AppState(queue, recipes, tmp_path, private=False)
    owner, job, shown = state.attach(None, None)
    assert owner and job is None and shown == {}
    job_id, _ = state.start(owner, None, PROMPT_LABEL, "a cat", None, *NO_OPTIONS)
    assert state.attach(None, None)[1] == job_id  # another page, no id in the browser: the running job
    assert state.attach(owner, "gone-after-restart") == (owner, job_id, {})
    job = queue.get(job_id)
    job.progress = {"step": 3, "max_steps": 10}
    *updates, shown = state.refresh(owner, job_id, {})
    status, image, model, video, files, cancel, timer = updates
    assert 'data-step="3"' in status["value"] and cancel["interactive"] is True and timer["active"] is True
    *again, shown2 = state.refresh(owner, job_id, shown)
    assert all(update == gr.skip() for update in again) and shown2 == shown
    job.state, job.progress = FINISHED, {"step": 10, "max_steps": 10}
    *updates, shown3 = state.refresh(owner, job_id, shown2)
    assert 'data-state="finished"' in updates[0]["value"] and updates[5]["interactive"] is False and updates[6]["active"] is False
    assert "there is no queued or running job" in state.cancel(owner, job_id)


def test_an_image_run_gets_the_uploaded_photo(tmp_path):
    """The built-in image-to-3D recipes take one uploaded photo as data.image; anything else is a message."""
    import numpy as np
    from PIL import Image

    from lift3d.app.recipes import IMAGE, default_recipes, offered_recipes

    image_recipes = [r for r in offered_recipes(default_recipes()) if r.recipe.input == IMAGE]
    assert {r.label for r in image_recipes} >= {"Image to 3D: DreamGaussian (Gaussians, then a mesh)",
                                                "Image to 3D: Zero123 NeRF"}
    queue = FakeQueue()
    state = AppState(queue, image_recipes, tmp_path)
    owner = state.new_owner()
    label = image_recipes[0].label
    assert "upload one photo" in _message(state.start(owner, None, label, "", None, *NO_OPTIONS))
    photo = tmp_path / "mug.png"
    Image.fromarray(np.zeros((8, 8, 4), np.uint8)).save(photo)
    job_id, _ = state.start(owner, None, label, "", [str(photo)], "7", "", "", "", "")
    assert job_id == "job0"
    [spec] = queue.submitted
    cfg = load_config(spec.config, overrides=spec.overrides)
    assert spec.input.endswith("mug.png") and Path(spec.input).is_file() and cfg.trainer.max_steps == 7
    command = job_command(spec)  # the method runs through its front end, the photo as its --image
    assert command[0] == "generate" and command[command.index("--image") + 1] == spec.input
    assert "upload one photo" in _message(state.start(owner, None, label, "", [str(photo), str(photo)], *NO_OPTIONS))
