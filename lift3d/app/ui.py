"""The page (Gradio Blocks): recipe, prompt or photos, a few options, Start/Cancel, live progress, 3D result.

The page keeps only a job id (in the browser's localStorage), so a reload, or a fresh page with no id,
finds the run again from the server's job queue. A timer refreshes the progress panel every second and
sends images, the model and downloads only when they change.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from pathlib import Path
from typing import Any

import gradio as gr

from lift3d.app.jobs import ACTIVE, FINISHED, JobQueue, JobSpec
from lift3d.app.recipes import IMAGE, OPTIONS, PHOTOS, PROMPT, OfferedRecipe, RecipeError, build_overrides, find_recipe
from lift3d.app.uploads import UploadError, prepare_image, prepare_scene
from lift3d.app.views import CSS, HEAD, job_view, message_html, result_values, status_html

log = logging.getLogger("lift3d")

OPTION_LABELS = {
    "steps": ("Steps", "training steps"),
    "seed": ("Seed", "random seed"),
    "resolution": ("Resolution", "training render size in pixels"),
    "guidance_scale": ("Guidance scale", "classifier-free guidance strength"),
    "model_path": ("Model", "diffusion model: a hub id or a local diffusers folder"),
}


EDITORS = {"InstructPix2Pix": "instruct-pix2pix", "Colour transform (offline)": "analytic"}  # label -> lift3d edit --editor


def _describe(recipe: OfferedRecipe | None) -> str:
    if recipe is None:
        return "**No recipe is installed.** Recipe configs live in `lift3d/configs/`."
    kind = "a text prompt" if recipe.input == PROMPT else "posed photos (Blender layout: transforms_*.json + images)"
    return f"{recipe.recipe.description} Takes {kind}."


def _placeholder(recipe: OfferedRecipe | None, option: str) -> str:
    default = recipe.defaults.get(option) if recipe else None
    return f"recipe default: {default}" if default is not None else "recipe default"


class AppState:
    """What the page's handlers share: the queue, the offered recipes and where runs write."""

    def __init__(self, queue: JobQueue, recipes: list[OfferedRecipe], output_root: Path) -> None:
        self.queue = queue
        self.recipes = recipes
        self.output_root = Path(output_root).resolve()

    # ----------------------------------------------------------------------------------- handlers
    def recipe_changed(self, label: str) -> list[Any]:
        recipe = next((r for r in self.recipes if r.label == label), None)
        takes_prompt = recipe is None or recipe.input == PROMPT
        updates = [gr.update(value=_describe(recipe)), gr.update(visible=takes_prompt), gr.update(visible=not takes_prompt)]
        updates += [gr.update(visible=recipe is not None and option in recipe.option_keys, placeholder=_placeholder(recipe, option))
                    for option in OPTIONS]
        return updates

    def start(self, job_id: str | None, label: str, prompt: str, uploads: Any, *values: Any) -> tuple[Any, str]:
        """Check the input, queue the run, and remember its id in the browser; errors become a message."""
        try:
            recipe = find_recipe(self.recipes, label)
            poses_from = ""
            if recipe.input == PROMPT:
                text = " ".join((prompt or "").split())
                if not text:
                    raise RecipeError("type a prompt first: describe the object to make, e.g. 'a ceramic mug shaped like a fox'")
                title = text
            elif recipe.input == IMAGE:
                files = [uploads] if isinstance(uploads, (str, Path)) else list(uploads or [])
                image = prepare_image(files, self.output_root / "app-uploads" / uuid.uuid4().hex[:10])
                text, title = str(image), image.name
            else:
                files = [uploads] if isinstance(uploads, (str, Path)) else list(uploads or [])
                scene = prepare_scene(files, self.output_root / "app-uploads" / uuid.uuid4().hex[:10])
                text, title = str(scene.root), f"{Path(files[0]).name} ({scene.summary()})"
                poses_from = str(scene.poses_from or "")
            options = dict(zip(OPTIONS, values))
            overrides = build_overrides(recipe, text, options)
            from lift3d.config import ConfigError, load_config

            try:
                load_config(recipe.config_path, overrides=overrides)
            except ConfigError as error:
                raise RecipeError(f"the options do not fit recipe '{recipe.label}': {error}") from None
            spec = JobSpec(recipe.config_path, overrides, self.output_root, recipe=recipe.label, title=title,
                           export=recipe.recipe.export, export_formats=list(recipe.recipe.export_formats or []) or None,
                           poses_from=poses_from)
            job = self.queue.submit(spec)
        except (RecipeError, UploadError) as error:
            return gr.skip(), message_html(str(error), "error")
        except Exception as error:  # the server keeps running whatever goes wrong with one request
            log.error("could not start a job:\n%s", traceback.format_exc())
            return gr.skip(), message_html(f"could not start the run: {type(error).__name__}: {error}", "error")
        position = self.queue.position(job)
        where = f"queued at position {position}" if position > 1 else "starting"
        return job.id, message_html(f"Run {job.id} {where}: {recipe.label}", "info")

    def edit(self, job_id: str | None, instruction: str, editor: str = "instruct-pix2pix") -> tuple[Any, str]:
        """Queue ``lift3d edit`` on the shown job's reconstruction (a finished photos run) with ``instruction``."""
        job = self.queue.get(job_id)
        text = " ".join((instruction or "").split())
        recipe = next((r for r in self.recipes if job is not None and r.label == job.spec.recipe), None)
        trial = job.trial_dir if job is not None else None
        if job is None or job.state != FINISHED or trial is None or not (trial / "ckpts" / "last.ckpt").is_file():
            return gr.skip(), message_html("edit a finished reconstruction: run a Photos to 3D recipe to the end first", "error")
        if (recipe is None or recipe.input != PHOTOS) and not job.spec.edit_of:
            return gr.skip(), message_html(f"'{job.spec.recipe}' is not a reconstruction: only Photos to 3D results can be "
                                           "edited", "error")
        if not text:
            return gr.skip(), message_html("type an edit instruction first, e.g. 'make it look like bronze'", "error")
        spec = JobSpec(trial / "configs" / "parsed.yaml", [], self.output_root, recipe=f"Edit of {job.spec.recipe}",
                       title=text, export=job.spec.export, export_formats=job.spec.export_formats, edit_of=str(trial),
                       editor=editor if editor in EDITORS.values() else "instruct-pix2pix")
        edit = self.queue.submit(spec)
        return edit.id, message_html(f"Run {edit.id}: editing run {job.id} ({text})", "info")

    def cancel(self, job_id: str | None) -> str:
        job = self.queue.get(job_id)
        if job is None or not job.active:
            return message_html("there is no queued or running job to cancel", "error")
        self.queue.cancel(job.id)
        return message_html(f"Cancelling run {job.id}; its last checkpoint stays in ckpts/", "info")

    def attach(self, job_id: str | None) -> tuple[str | None, dict]:
        """On page load: the browser's job if the server knows it, else the running (or newest) job."""
        job = self.queue.get(job_id) or self.queue.latest()
        return (job.id if job else None), {}

    def refresh(self, job_id: str | None, shown: dict | None) -> list[Any]:
        """The panel, latest grid, model, video, downloads, Cancel button and timer; unchanged ones are skipped."""
        shown = dict(shown or {})
        job = self.queue.get(job_id)
        view = job_view(job, self.queue.position(job)) if job else None
        model = video = None
        files: list[str] = []
        if job is not None and not job.active:
            model, video, files = result_values(job.results())
        wanted = {
            "job": job.id if job else None,
            "status": status_html(view),
            "image": view.latest_image if view else None,
            "model": model,
            "video": video,
            "files": files,
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


def build_app(queue: JobQueue, recipes: list[OfferedRecipe], output_root: Path) -> gr.Blocks:
    """The Blocks app over ``queue`` offering ``recipes``."""
    state = AppState(queue, recipes, output_root)
    first = recipes[0] if recipes else None
    with gr.Blocks(title="lift3d", analytics_enabled=False) as demo:
        gr.Markdown("# lift3d\nText or photos to 3D: pick a recipe, give it a prompt or posed photos, and press Start.")
        job_id = gr.BrowserState(None, storage_key="lift3d-app-job")
        shown = gr.State({})
        with gr.Row():
            with gr.Column(scale=1, min_width=320):
                recipe = gr.Dropdown([r.label for r in recipes], value=first.label if first else None, label="Recipe",
                                     elem_id="recipe")
                about = gr.Markdown(_describe(first), elem_id="recipe-about")
                prompt = gr.Textbox(label="Prompt", placeholder="a ceramic mug shaped like a fox", lines=2, elem_id="prompt",
                                    visible=first is None or first.input == PROMPT)
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
                video = gr.Video(label="Orbit video", interactive=False, elem_id="result-video", autoplay=True, loop=True, height=320)
                files = gr.File(label="Downloads", file_count="multiple", interactive=False, elem_id="result-files")
                with gr.Row():  # an action on a finished reconstruction: lift3d edit RUN "instruction"
                    instruction = gr.Textbox(label="Edit this reconstruction", placeholder="make it look like bronze",
                                             elem_id="edit-instruction", scale=3)
                    editor = gr.Dropdown(list(EDITORS.items()), value="instruct-pix2pix", label="Editor", elem_id="editor", scale=1)
                    edit = gr.Button("Edit", elem_id="edit", scale=1)
        timer = gr.Timer(1.0, active=False)
        outputs = [status, latest, model, video, files, cancel, timer, shown]

        recipe.change(state.recipe_changed, recipe, [about, prompt, upload, *option_inputs], queue=False)
        start.click(state.start, [job_id, recipe, prompt, upload, *option_inputs], [job_id, message],
                    concurrency_limit=None, show_progress="minimal").then(
            state.refresh, [job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        cancel.click(state.cancel, job_id, message, concurrency_limit=None, show_progress="hidden")
        edit.click(state.edit, [job_id, instruction, editor], [job_id, message], concurrency_limit=None,
                   show_progress="minimal").then(
            state.refresh, [job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        timer.tick(state.refresh, [job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
        demo.load(state.attach, job_id, [job_id, shown], concurrency_limit=None).then(
            state.refresh, [job_id, shown], outputs, concurrency_limit=None, show_progress="hidden")
    return demo


def launch(queue: JobQueue, recipes: list[OfferedRecipe], output_root: Path, host: str = "127.0.0.1", port: int = 7860,
           share: bool = False) -> None:
    """Serve the app until interrupted; running jobs are then cancelled (their last checkpoints stay)."""
    output_root = Path(output_root).resolve()
    output_root.mkdir(parents=True, exist_ok=True)
    demo = build_app(queue, recipes, output_root)
    theme = gr.themes.Default(font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"])
    try:
        demo.queue(default_concurrency_limit=None).launch(
            server_name=host, server_port=port, share=share, allowed_paths=[str(output_root)], theme=theme, css=CSS, head=HEAD,
            show_error=True, ssr_mode=False,
        )
    finally:
        queue.close()

