"""``lift3d.generate(prompt | image=..., method=...)``: a text prompt or one photo -> a trained run, every stage of the
method in turn (each stage continues from the previous one's checkpoint)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from lift3d.api.overrides import as_overrides, devices_overrides, gpu_ids
from lift3d.api.run import Run
from lift3d.method_table import IMAGE, TEXT, Method, find_method, stage_recipes

log = logging.getLogger("lift3d")
OVERRIDE = re.compile(r"[A-Za-z_][\w.\\]*=.*")  # what a KEY=VALUE override looks like (not a prompt)
CARRIED_GUIDANCE_KEYS = ("system.guidance.prompt", "system.guidance.negative_prompt")  # reach a stage of another model


def generate(prompt: str | None = None, *, image: str | Path | None = None, method: str | None = None,
             elevation: float = 0.0, refine: bool = False, refine_steps: int | None = None,
             refine_overrides: Sequence[str] = (), gpus: Iterable[int] | str | None = None, nodes: int | None = None,
             overrides: Sequence[str] = (), callbacks: Callable[..., Any] | None = None, **settings: Any) -> Run:
    """Make a 3D asset from a text ``prompt`` or from one photo (``image``) and return the last stage's run.

    ``method``: a text or image method of ``lift3d.methods()`` (default ``gaussian-sds`` for text, ``dreamgaussian`` for
    an image). ``elevation``: the photo's camera elevation in degrees. ``refine``: also run the method's refine stages
    (``triposr``'s Zero123 refinement, a text method's mesh stage); ``refine_steps``: steps of every stage after the first
    (0: only the first stage); ``refine_overrides``: ``key=value`` overrides for those stages only. Config overrides of
    every stage come as ``settings`` by dotted key or as ``key=value`` strings in ``overrides``."""
    task = IMAGE if image is not None else TEXT
    chosen = find_method(method, task)
    user = as_overrides(settings, overrides)
    if task == TEXT:
        inputs = prompt_overrides(prompt)
    else:
        inputs = image_overrides(image, elevation, check_image_prompt(chosen, prompt))
    if refine and not chosen.refine_stages:
        from lift3d.method_table import methods

        refinable = ", ".join(m.name for m in methods(task) if m.refine_stages)
        raise _config_error(f"--refine adds a method's refine stages; {chosen.name} has none (its stages always run; skip "
                          f"them with --refine-steps 0). Methods with refine stages: {refinable}")
    stages = stage_recipes(chosen, refine=refine)
    if refine_steps == 0:
        stages = stages[:1]
    notice = cuda_notice(chosen, stages)
    if notice:
        log.warning("warning: %s", notice)
    devices = devices_overrides(gpu_ids(gpus), nodes)
    runs: list[Run] = []
    for index, recipe in enumerate(stages):
        stage_overrides = first_stage_overrides(chosen, stages, inputs, devices, user) if index == 0 else \
            later_stage_overrides(chosen, stages[0], recipe, runs[-1], inputs, devices, user, refine_steps, refine_overrides)
        what = f"{'making 3D from ' + str(image) if task == IMAGE else 'generating ' + repr(prompt)} with {chosen.name}"
        announce = what if index == 0 else f"{'refinement' if recipe in chosen.refine_stages else 'mesh stage'} " \
                                           f"from {runs[-1].path}"
        runs.append(train_stage(recipe, stage_overrides, announce, callbacks))
    return Run(runs[-1].path, stages=runs[:-1])


def _config_error(message: str) -> Exception:
    from lift3d.config import ConfigError

    return ConfigError(message)


def prompt_tag(prompt: str, limit: int = 48) -> str:
    """A folder-safe tag from the prompt: ``"A DSLR photo of a hamburger!"`` -> ``A_DSLR_photo_of_a_hamburger``."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", prompt).strip("_")
    return words[:limit].rstrip("_") or "prompt"


def prompt_overrides(prompt: str | None) -> list[str]:
    """The prompt (quoted, so any characters survive the dotlist parser) and a run tag made from it."""
    if prompt is None or not prompt.strip():
        raise _config_error('give a prompt: lift3d generate "a DSLR photo of a hamburger" (or --image PHOTO)')
    if re.fullmatch(r"[A-Za-z_][\w.]*=\S*", prompt):
        raise _config_error(f"{prompt!r} looks like an override, not a prompt: give the prompt first, e.g. "
                            'lift3d generate "a DSLR photo of a hamburger" trainer.max_steps=500')
    return [f"system.guidance.prompt={json.dumps(prompt)}", f"tag={prompt_tag(prompt)}"]


def check_image_prompt(method: Method, prompt: str | None) -> str | None:
    """The prompt an image method takes beside the photo: required by some (magic123), refused by the others."""
    if method.prompt == "required" and not prompt:
        raise _config_error(f'{method.name} adds a text prior: give a prompt, e.g. lift3d generate --image photo.png '
                            f'--method {method.name} "a DSLR photo of a teddy bear"')
    if prompt and method.prompt == "none":
        raise _config_error(f"{method.name} makes 3D from the photo alone; a prompt is for the methods that take one "
                            f"(got {prompt!r})")
    return prompt


def image_overrides(image: str | Path, elevation: float, prompt: str | None) -> list[str]:
    """The photo, its elevation, a tag from its name, and the prompt of a method that takes one."""
    path = Path(image).expanduser().resolve()
    if not path.is_file():
        raise _config_error(f"--image {image}: no such file (give a .png or .jpg of the object)")
    overrides = [f"data.image={json.dumps(str(path))}", f"data.elevation_deg={float(elevation)}",
                 f"tag={prompt_tag(path.stem)}"]
    if prompt:
        overrides.append(f"system.text_guidance.prompt={json.dumps(prompt)}")
    return overrides


def first_stage_overrides(method: Method, stages: list[str], inputs: list[str], devices: list[str],
                          user: list[str]) -> list[str]:
    """The first stage's overrides: the inputs, the devices, no mesh exports when a mesh stage follows (it builds its own
    mesh from this stage's checkpoint; a feed-forward result keeps its mesh: a preview while it is refined), the user's."""
    from lift3d.recipes import recipe_config

    trimmed = []
    if len(stages) > 1 and stages[1] not in method.refine_stages:
        trimmed = without_mesh_exports(recipe_config(stages[0]))
    return [*inputs, *devices, *trimmed, *user]


def later_stage_overrides(method: Method, first: str, recipe: str, previous: Run, inputs: list[str], devices: list[str],
                          user: list[str], refine_steps: int | None, refine_overrides: Sequence[str]) -> list[str]:
    """A later stage's overrides: the inputs, the devices, the previous stage's checkpoint, the user's overrides that fit
    this stage (guidance settings only where this stage loads the same model; the prompt always), its step count, then
    the overrides meant for the later stages only."""
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config

    plain = load_config(recipe_config(recipe))
    same_model = plain.system.get("guidance_type") == load_config(recipe_config(first)).system.get("guidance_type")
    carried = [item for item in user if (applies_to(item, plain) and (same_model or carries_to_other_model(item)))
               or item.split("=", 1)[0].startswith(method.shared_keys)]
    steps = [f"trainer.max_steps={refine_steps}", f"trainer.val_check_interval={refine_steps}"] if refine_steps else []
    checkpoint = previous.path / "ckpts" / "last.ckpt"
    return [*[item for item in inputs if applies_to(item, plain)], *devices,
            f"system.geometry_convert_from={json.dumps(str(checkpoint))}", *carried, *steps, *refine_overrides]


def carries_to_other_model(override: str) -> bool:
    """Whether an override also applies to a stage that loads another guidance model (only the prompts carry over)."""
    key = override.split("=", 1)[0].replace("\\.", ".")
    return not key.startswith("system.guidance.") or key in CARRIED_GUIDANCE_KEYS


def applies_to(override: str, cfg: Any) -> bool:
    """Whether a KEY=VALUE override names a key the config has (a later stage takes the options that fit it); trainer
    settings stay with the stage they were given for."""
    from omegaconf import OmegaConf

    key = override.split("=", 1)[0].replace("\\.", ".")
    missing = object()
    return not key.startswith("trainer.") and OmegaConf.select(OmegaConf.structured(cfg), key, default=missing) is not missing


def without_mesh_exports(config: Path) -> list[str]:
    """An override leaving the mesh formats out of a first stage's exports when a mesh stage follows it: that stage
    builds its own mesh, so the first stage's marching cubes, UV atlas and baking would only delay the final .glb. The
    user's own ``system.export.formats`` wins (it comes later)."""
    from lift3d.config import load_config
    from lift3d.export.config import ExportConfig
    from lift3d.export.formats import formats_from

    export = load_config(config).system.get("export") or {}
    formats = list(export.get("formats", ExportConfig().formats))
    kept = [name for name in formats if name not in formats_from("mesh")]
    return [] if kept == formats else [f"system.export.formats=[{','.join(kept)}]"]


def train_stage(recipe: str, overrides: list[str], announce: str, callbacks: Callable[..., Any] | None) -> Run:
    """Load ``recipe`` with ``overrides``, say what runs, train; the stage's run."""
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment

    config = recipe_config(recipe)
    cfg = load_config(config, overrides=overrides)
    log.info("%s (%s, %d steps)", announce, config.name, cfg.trainer.max_steps)
    run = Run(run_experiment("train", cfg, [config], overrides, callbacks=callbacks))
    log.info("results in %s", run.path)
    return run


def cuda_notice(method: Method, stages: list[str]) -> str | None:
    """Without a CUDA GPU, one line saying that the stages about to run need one, and the offline twin of the method
    that runs on the CPU (None on a CUDA machine, or when every stage runs on the CPU)."""
    needs = method.needs_cuda or any(stage in method.refine_stages for stage in stages)
    if not needs or all(stage.endswith("-analytic") for stage in stages):
        return None
    import torch

    if torch.cuda.is_available():
        return None
    from lift3d.data.sample_scene import sample_scene_path

    twin = f"; the offline twin runs the same pipeline on the CPU without weights: lift3d train {method.offline_twin} " \
           f"data.reference_scene={sample_scene_path()}" if method.offline_twin else ""
    return (f"{method.name} ({', '.join(stages)}) runs a diffusion model, which needs a CUDA GPU, and torch sees none "
            f"here: on the CPU each step takes seconds to minutes{twin}")
