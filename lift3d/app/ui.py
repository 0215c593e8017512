"""The page (Gradio Blocks): recipe, prompt or photos, a few options, Start/Cancel, live progress, 3D result.

The page keeps a job id and an owner token (a secret the server issues on first load) in the browser's
localStorage, so a reload finds its run again from the server's job queue. When the app is private (bound
beyond localhost, or shared), a page sees, cancels and edits only the jobs its owner token started, and a
fresh page with no job id finds only its own; on localhost every page sees every job. Result files are
handed to the browser as copies under unguessable names in gradio's cache (``publish``), never by serving
the output folder, so a page can fetch only what it was shown. A timer refreshes the progress panel every
second and sends images, the model and downloads only when they change.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import secrets
import shutil
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any

import gradio as gr

from lift3d.app.jobs import ACTIVE, FINISHED, QUEUED, Job, JobQueue, JobSpec
from lift3d.app.recipes import IMAGE, OPTIONS, PHOTOS, PROMPT, OfferedRecipe, RecipeError, build_overrides, find_recipe
from lift3d.app.results import describe_kept
from lift3d.app.uploads import MAX_UPLOAD_BYTES, UploadError, prepare_image, prepare_scene
from lift3d.app.views import CSS, HEAD, job_view, message_html, result_values, status_html

log = logging.getLogger("lift3d")

OPTION_LABELS = {
    "steps": ("Steps", "training steps"),
    "seed": ("Seed", "random seed"),
    "resolution": ("Resolution", "training render size in pixels"),
    "guidance_scale": ("Guidance scale", "classifier-free guidance strength"),
    "model_path": ("Model", "diffusion model: a hub id or a local diffusers folder"),
}


EDITORS = {"InstructPix2Pix": "instruct-pix2pix", "Color transform (offline)": "analytic"}  # label -> lift3d edit --editor


def _describe(recipe: OfferedRecipe | None) -> str:
    if recipe is None:
        return "**No recipe is installed.** Recipe configs live in `lift3d/configs/`."
    kind = {PROMPT: "a text prompt", IMAGE: "one photo of an object" + (" and a prompt" if recipe.takes_prompt else ""),
            PHOTOS: "photos (a .zip or the files), a video, or a posed scene (COLMAP, transforms.json, Blender)"}
    needs = f" Needs: {recipe.needs()}." if recipe.needs() else ""
    return f"{recipe.recipe.description} Takes {kind.get(recipe.input, recipe.input)}.{needs}"


def menu_entry(recipe: OfferedRecipe, cuda: bool) -> tuple[str, str]:
    """(what the menu shows, the recipe's label): a recipe that cannot run on this machine says what it needs."""
    return (recipe.label if recipe.runs_on(cuda) else f"{recipe.label} (needs a CUDA GPU)", recipe.label)


def first_runnable(recipes: list[OfferedRecipe], cuda: bool) -> OfferedRecipe | None:
    """The recipe the page opens on: the first one that runs on this machine (else the first one)."""
    return next((r for r in recipes if r.runs_on(cuda)), recipes[0] if recipes else None)


def _placeholder(recipe: OfferedRecipe | None, option: str) -> str:
    default = recipe.defaults.get(option) if recipe else None
    return f"recipe default: {default}" if default is not None else "recipe default"


def is_private(host: str, share: bool = False) -> bool:
    """Whether pages of an app on ``host`` may belong to different people: a share link, or any address but a
    loopback one (a host name other than localhost counts as reachable by others)."""
    if share:
        return True
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return True


def default_publish_root() -> Path:
    """Where result files are handed to gradio: a folder in its cache, which it serves by exact path only."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()) / "lift3d-results"


class AppState:
    """What the page's handlers share: the queue, the offered recipes, where runs write, and whose job is whose.

    Every handler takes the page's owner token first (a gr.BrowserState the server fills in on load)."""

    def __init__(self, queue: JobQueue, recipes: list[OfferedRecipe], output_root: Path, *, private: bool = True,
                 max_upload_bytes: int = MAX_UPLOAD_BYTES, publish_root: Path | None = None, cancel_wait_s: float = 20.0) -> None:
        self.queue = queue
        self.recipes = recipes
        self.output_root = Path(output_root).resolve()
        self.private = private  # pages see only their own jobs (else every page sees every job, as on localhost)
        self.max_upload_bytes = max_upload_bytes
        self.publish_root = Path(publish_root) if publish_root else None  # None: gradio's cache folder, found when needed
        self.cancel_wait_s = cancel_wait_s  # how long Cancel waits to report what the run kept
        self._owners: set[str] = set()  # the owner tokens this server issued
        self._lock = threading.Lock()
        self._secret = secrets.token_hex(16)  # keys the published file names: unguessable without it

    # ----------------------------------------------------------------------------------- sessions
    def new_owner(self) -> str:
        """A fresh owner token (a page session's secret)."""
        owner = secrets.token_urlsafe(24)
        with self._lock:
            self._owners.add(owner)
        return owner

    def known(self, owner: str | None) -> bool:
        with self._lock:
            return bool(owner) and owner in self._owners

    def _job(self, owner: str | None, job_id: str | None) -> Job | None:
        """The job ``job_id`` if this page may see it: its own (private app) or any (localhost)."""
        job = self.queue.get(job_id)
        if job is None or not self.private:
            return job
        return job if self.known(owner) and secrets.compare_digest(job.spec.owner, owner) else None

    def _latest(self, owner: str | None) -> Job | None:
        """For a page with no job: the newest running or queued job it may see, else the newest of them."""
        if not self.private:
            return self.queue.latest()
        mine = [j for j in self.queue.jobs() if self._job(owner, j.id) is not None]
        active = [j for j in mine if j.active]
        return (active or mine)[-1] if (active or mine) else None

    def publish(self, path: str | Path | None) -> str | None:
        """A result file as the browser gets it: linked (or copied) into gradio's cache under a name keyed by a
        server secret, the file's path and version, so that only a page shown it can fetch it."""
        if path is None:
            return None
        source = Path(path)
        try:
            info = source.stat()
        except OSError:
            return None
        key = f"{self._secret}\0{source.resolve()}\0{info.st_size}\0{info.st_mtime_ns}".encode()
        root = self.publish_root or default_publish_root()
        target = root / hashlib.sha256(key).hexdigest()[:32] / source.name
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.part")
            try:
                os.link(source, staging)
            except OSError:  # another file system, or links not allowed
                shutil.copyfile(source, staging)
            os.replace(staging, target)
        return str(target)

    # ----------------------------------------------------------------------------------- handlers
    def recipe_changed(self, label: str) -> list[Any]:
        recipe = next((r for r in self.recipes if r.label == label), None)
        takes_prompt = recipe is None or recipe.input == PROMPT or recipe.takes_prompt
        updates = [gr.update(value=_describe(recipe)), gr.update(visible=takes_prompt),
                   gr.update(visible=recipe is not None and recipe.input != PROMPT)]
        updates += [gr.update(visible=recipe is not None and option in recipe.option_keys,
                              placeholder=_placeholder(recipe, option)) for option in OPTIONS]
        return updates

    def start(self, owner: str | None, job_id: str | None, label: str, prompt: str, uploads: Any,
              *values: Any) -> tuple[Any, str]:
        """Check the input, queue the run, and remember its id in the browser; errors become a message. A rejected
        upload leaves nothing in the upload folder."""
        upload_dir = self.output_root / "app-uploads" / uuid.uuid4().hex[:10]
        try:
            if self.private and not self.known(owner):
                raise RecipeError("this page is not known to the server (it restarted?): reload the page")
            recipe = find_recipe(self.recipes, label)
            options = dict(zip(OPTIONS, values))
            build_overrides(recipe, "", options)  # bad options are refused before an upload is unpacked
            poses_from, image_prompt = "", ""
            if recipe.input == PROMPT:
                text = " ".join((prompt or "").split())
                if not text:
                    raise RecipeError("type a prompt first: describe the object to make, e.g. 'a ceramic mug shaped like a fox'")
                title = text
            elif recipe.input == IMAGE:
                image_prompt = " ".join((prompt or "").split()) if recipe.takes_prompt else ""
                if recipe.needs_prompt and not image_prompt:
                    raise RecipeError(f"'{recipe.label}' takes a prompt beside the photo: describe the object, e.g. "
                                      "'a DSLR photo of a teddy bear'")
                files = [uploads] if isinstance(uploads, (str, Path)) else list(uploads or [])
                image = prepare_image(files, upload_dir, self.max_upload_bytes)
                text, title = str(image), image.name
            else:
                files = [uploads] if isinstance(uploads, (str, Path)) else list(uploads or [])
                scene = prepare_scene(files, upload_dir, self.max_upload_bytes)
                text, title = str(scene.root), f"{Path(files[0]).name} ({scene.summary()})"
                poses_from = str(scene.poses_from or "")
            overrides = build_overrides(recipe, text, options)
            from lift3d.config import ConfigError, load_config

            try:
                load_config(recipe.config_path, overrides=overrides)
            except ConfigError as error:
                raise RecipeError(f"the options do not fit recipe '{recipe.label}': {error}") from None
            method = recipe.recipe.method
            spec = JobSpec(recipe.config_path, build_overrides(recipe, None, options) if method else overrides,
                           self.output_root, recipe=recipe.label, title=title, export=recipe.recipe.export,
                           export_formats=list(recipe.recipe.export_formats or []) or None, poses_from=poses_from,
                           owner=owner or "", method=method, task=recipe.input, input=text, prompt=image_prompt)
            job = self.queue.submit(spec)
        except (RecipeError, UploadError) as error:
            shutil.rmtree(upload_dir, ignore_errors=True)
            return gr.skip(), message_html(str(error), "error")
        except Exception as error:  # the server keeps running whatever goes wrong with one request
            shutil.rmtree(upload_dir, ignore_errors=True)
            log.error("could not start a job:\n%s", traceback.format_exc())
            return gr.skip(), message_html(f"could not start the run: {type(error).__name__}: {error}", "error")
        position = self.queue.position(job)
        where = f"queued at position {position}" if position > 1 else "starting"
        return job.id, message_html(f"Run {job.id} {where}: {recipe.label}", "info")

    def edit(self, owner: str | None, job_id: str | None, instruction: str, editor: str = "instruct-pix2pix") -> tuple[Any, str]:
        """Queue ``lift3d edit`` on the shown job's reconstruction (a finished photos run) with ``instruction``."""
        job = self._job(owner, job_id)
        text = " ".join((instruction or "").split())
        recipe = next((r for r in self.recipes if job is not None and r.label == job.spec.recipe), None)
        run_dir = job.run_dir if job is not None else None
        if job is None or job.state != FINISHED or run_dir is None or not (run_dir / "ckpts" / "last.ckpt").is_file():
            return gr.skip(), message_html("edit a finished reconstruction: run a Photos to 3D recipe to the end first", "error")
        if (recipe is None or recipe.input != PHOTOS) and not job.spec.edit_of:
            return gr.skip(), message_html(f"'{job.spec.recipe}' is not a reconstruction: only Photos to 3D results can be "
                                           "edited", "error")
        if not text:
            return gr.skip(), message_html("type an edit instruction first, e.g. 'make it look like bronze'", "error")
        spec = JobSpec(run_dir / "configs" / "parsed.yaml", [], self.output_root, recipe=f"Edit of {job.spec.recipe}",
                       title=text, export=job.spec.export, export_formats=job.spec.export_formats, edit_of=str(run_dir),
                       editor=editor if editor in EDITORS.values() else "instruct-pix2pix", owner=job.spec.owner)
        edit = self.queue.submit(spec)
        return edit.id, message_html(f"Run {edit.id}: editing run {job.id} ({text})", "info")

    def cancel(self, owner: str | None, job_id: str | None) -> str:
        """Cancel the page's job; the message says what the run kept (its newest checkpoint and step, or none),
        read from its ckpts/ once it stopped (or, if it takes longer than ``cancel_wait_s``, so far)."""
        job = self._job(owner, job_id)
        if job is None or not job.active:
            return message_html("there is no queued or running job to cancel", "error")
        queued = job.state == QUEUED
        self.queue.cancel(job.id)
        if queued:
            return message_html(f"Cancelled run {job.id} before it started; nothing was kept", "info")
        self.queue.wait(job.id, timeout=self.cancel_wait_s)
        if not job.active:
            return message_html(f"Run {job.id} {job.note or job.state}", "info")
        step = job.progress.get("step")
        return message_html(f"Stopping run {job.id}{f' at step {step}' if step is not None else ''} (the panel says what it "
                            f"kept once it stops); so far: {describe_kept(job.run_dir, None)}", "info")

    def attach(self, owner: str | None, job_id: str | None) -> tuple[str, str | None, dict]:
        """On page load: the page's owner token (a new one when the server does not know it), and the browser's job
        if this page may see it, else its running (or newest) job."""
        if not self.known(owner):
            owner = self.new_owner()
        job = self._job(owner, job_id) or self._latest(owner)
        return owner, (job.id if job else None), {}

    def refresh(self, owner: str | None, job_id: str | None, shown: dict | None) -> list[Any]:
        """The panel, latest grid, model, video, downloads, Cancel button and timer; unchanged ones are skipped."""
        shown = dict(shown or {})
        job = self._job(owner, job_id)
        view = job_view(job, self.queue.position(job)) if job else None
        model = video = None
        files: list[str] = []
        if job is not None and not job.active:
            model, video, files = result_values(job.results())
        wanted = {
            "job": job.id if job else None,
            "status": status_html(view),
            "image": self.publish(view.latest_image) if view else None,
            "model": self.publish(model),
            "video": self.publish(video),
            "files": [p for p in map(self.publish, files) if p],
            "cancel": bool(job and job.state in ACTIVE),
            "timer": bool(job and job.state in ACTIVE),  # tick only while something runs: an idle page costs nothing
        }
        updates = []
        for key, value in wanted.items():
            if key == "job":
                continue
            if shown.get(key, "unset") == value and shown.get("job") == wanted["job"]:
                updates.append(gr.skip())
            elif key == "cancel":
                updates.append(gr.update(interactive=value))
            elif key == "timer":
                updates.append(gr.update(active=value))
            elif key == "files":
                updates.append(gr.update(value=value or None))
            else:
                updates.append(gr.update(value=value))
        return [*updates, wanted]


def build_app(queue: JobQueue, recipes: list[OfferedRecipe], output_root: Path, *, private: bool = True,
              max_upload_bytes: int = MAX_UPLOAD_BYTES) -> gr.Blocks:
    """The Blocks app over ``queue`` offering ``recipes``; ``private``: each page sees only the jobs it started. The
    page opens on a recipe that runs on this machine (the queue's slots say whether it has a CUDA GPU)."""
    state = AppState(queue, recipes, output_root, private=private, max_upload_bytes=max_upload_bytes)
    cuda = any(slot.startswith("cuda") for slot in queue.slots)
    first = first_runnable(recipes, cuda)
    with gr.Blocks(title="lift3d", analytics_enabled=False) as demo:
        gr.Markdown("# lift3d\nText or photos to 3D: pick a recipe, give it a prompt or posed photos, and press Start.")
        job_id = gr.BrowserState(None, storage_key="lift3d-app-job")
        owner = gr.BrowserState(None, storage_key="lift3d-app-owner")  # the page session's secret, issued on load
        shown = gr.State({})
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                recipe = gr.Dropdown([menu_entry(r, cuda) for r in recipes], value=first.label if first else None,
                                     label="Recipe", elem_id="recipe")
                about = gr.Markdown(_describe(first), elem_id="recipe-about")
                prompt = gr.Textbox(label="Prompt", placeholder="a ceramic mug shaped like a fox", lines=2, elem_id="prompt",
                                    visible=first is None or first.takes_prompt)
                upload = gr.File(label="Image to 3D: one photo of the object. Photos to 3D: photos (a .zip, or the files), "
                                       "a video, or a posed scene folder (.zip: Blender, transforms.json or COLMAP)",
                                 file_count="multiple", elem_id="scene-upload",
                                 visible=first is not None and first.input in (PHOTOS, IMAGE))
                option_inputs = []
                with gr.Accordion("Options", open=True):
                    for option in OPTIONS:
                        name, info = OPTION_LABELS[option]
                        visible = first is not None and option in first.option_keys
                        # text fields, so that blank means "the recipe's default" (a number field always sends a number)
                        option_inputs.append(gr.Textbox(label=name, info=info, elem_id=f"opt-{option}", visible=visible,
                                                        placeholder=_placeholder(first, option)))
                with gr.Row():
                    start = gr.Button("Start", variant="primary", elem_id="start")
                    cancel = gr.Button("Cancel", variant="stop", interactive=False, elem_id="cancel")
                message = gr.HTML("", elem_id="message")
            with gr.Column(scale=2, min_width=420):
                status = gr.HTML(status_html(None), elem_id="job-status")
                latest = gr.Image(label="Latest validation grid", type="filepath", interactive=False, elem_id="latest-image",
                                  height=220)
                model = gr.Model3D(label="Result", interactive=False, elem_id="result-model", height=420)
                video = gr.Video(label="Orbit video", interactive=False, elem_id="result-video", autoplay=True, loop=True,
                                 height=320)
                files = gr.File(label="Downloads", file_count="multiple", interactive=False, elem_id="result-files")
                with gr.Row():  # an action on a finished reconstruction: lift3d edit RUN "instruction"
                    instruction = gr.Textbox(label="Edit this reconstruction", placeholder="make it look like bronze",
                                             elem_id="edit-instruction", scale=3)
                    editor = gr.Dropdown(list(EDITORS.items()), value="instruct-pix2pix", label="Editor", elem_id="editor",
                                         scale=1)
                    edit = gr.Button("Edit", elem_id="edit", scale=1)
        timer = gr.Timer(1.0, active=False)
        outputs = [status, latest, model, video, files, cancel, timer, shown]

        recipe.change(state.recipe_changed, recipe, [about, prompt, upload, *option_inputs], queue=False)
        start.click(state.start, [owner, job_id, recipe, prompt, upload, *option_inputs], [job_id, message],
                    concurrency_limit=None, show_progress="minimal").then(
            state.refresh, [owner, job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        cancel.click(state.cancel, [owner, job_id], message, concurrency_limit=None, show_progress="minimal").then(
            state.refresh, [owner, job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        edit.click(state.edit, [owner, job_id, instruction, editor], [job_id, message], concurrency_limit=None,
                   show_progress="minimal").then(
            state.refresh, [owner, job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        timer.tick(state.refresh, [owner, job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        demo.load(state.attach, [owner, job_id], [owner, job_id, shown], concurrency_limit=None).then(
            state.refresh, [owner, job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
    return demo


def launch(queue: JobQueue, recipes: list[OfferedRecipe], output_root: Path, host: str = "127.0.0.1", port: int = 7860,
           share: bool = False, max_upload_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Serve the app until interrupted; running jobs are then canceled (their last checkpoints stay). The output
    folder is not served: result files reach a page only through ``AppState.publish``."""
    output_root = Path(output_root).resolve()
    output_root.mkdir(parents=True, exist_ok=True)
    private = is_private(host, share)
    print(f"lift3d: {'each page sees only the jobs it started' if private else 'every page sees every job (localhost)'}; "
          f"uploads up to {max_upload_bytes / 2**30:.3g} GiB", flush=True)
    demo = build_app(queue, recipes, output_root, private=private, max_upload_bytes=max_upload_bytes)
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    try:
        demo.queue(default_concurrency_limit=None).launch(
            server_name=host, server_port=port, share=share, theme=theme, css=CSS, head=HEAD, show_error=True, ssr_mode=False,
            max_file_size=max_upload_bytes,
        )
    finally:
        queue.close()
