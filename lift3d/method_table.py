"""The method table: every way lift3d makes 3D, read by ``lift3d reconstruct``, ``lift3d generate``, the Python API,
the web app and the docs, so that each front end offers exactly the same methods with the same recipes.

A method is a name the user picks (``--method``), the task it does (photos, text or one image to 3D), the recipes it
runs (its stages, each continuing from the previous one's checkpoint), the variants a machine without a CUDA GPU or
the built-in sample scene gets, and what it needs (a CUDA GPU, model weights). Plain data, no imports beyond the
standard library: the CLI reads it before it imports anything heavy.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

PHOTOS, TEXT, IMAGE = "photos", "text", "image"  # the tasks: photos -> 3D, a prompt -> 3D, one photo -> 3D
TASKS = (PHOTOS, TEXT, IMAGE)
SD_WEIGHTS = "Stable Diffusion 2.1 base"
ZERO123_WEIGHTS = "Zero123-XL"


class MethodError(ValueError):
    """An unknown method, or one that does not do the task asked of it; the message lists the ones that do."""


@dataclass(frozen=True)
class Method:
    """One way to make 3D, as every front end offers it."""

    name: str  # what the user picks: --method NAME, lift3d.reconstruct(method=NAME), the app's menu
    task: str  # photos, text or image (what the method starts from)
    label: str  # the name shown in the app's menu and the docs
    description: str  # one line: what it makes and how
    stages: tuple[str, ...]  # the recipes it runs in order, each from the previous one's checkpoint
    refine_stages: tuple[str, ...] = ()  # recipes that follow the stages only when refining is asked for (--refine)
    variants: Mapping[str, str] = field(default_factory=dict)  # sample / cpu / unbounded / unbounded-cpu -> recipe
    needs_cuda: bool = False  # its recipes run a diffusion model or a budget that needs a CUDA GPU
    weights: str = ""  # the pretrained model it loads ("" = none)
    weights_key: str = ""  # the config key naming that model (a hub id or a local folder)
    offline_twin: str = ""  # a recipe that runs the same pipeline with the weight-free analytic prior, on a CPU
    shared_keys: tuple[str, ...] = ()  # config key prefixes every stage shares (free-form dicts a later stage loads)
    prompt: str = "none"  # image methods: whether a text prompt is none, optional or required beside the photo
    default: bool = False  # the method of its task when none is named

    @property
    def recipes(self) -> tuple[str, ...]:
        """Every recipe the method may run: stages, refine stages and variants."""
        return (*self.stages, *self.refine_stages, *self.variants.values())


METHODS: tuple[Method, ...] = (
    Method("gaussians", PHOTOS, "Photos to 3D: Gaussian splatting",
           "3D Gaussian Splatting fitted to posed photos (gsplat on CUDA, PyTorch on the CPU).",
           ("reconstruct-gaussians",),
           variants={"sample": "reconstruct-gaussians-sample", "cpu": "reconstruct-gaussians-cpu"}, default=True),
    Method("nerf", PHOTOS, "Photos to 3D: NeRF",
           "A hash-grid NeRF fitted to posed photos; contracted (unbounded) for photos of real places.",
           ("reconstruct-nerf",),
           variants={"cpu": "reconstruct-nerf-cpu", "unbounded": "reconstruct-nerf-unbounded",
                     "unbounded-cpu": "reconstruct-nerf-unbounded-cpu"}),
    Method("surfels", PHOTOS, "Photos to 3D: surfels (2DGS meshes)",
           "2D Gaussian surfels fitted to posed photos, meshed by fusing their rendered depth (TSDF).",
           ("reconstruct-surfels",),
           variants={"sample": "reconstruct-surfels-sample", "cpu": "reconstruct-surfels-cpu"}),
    Method("gaussian-sds", TEXT, "Text to 3D: Gaussian SDS (fast)",
           "3D Gaussians distilled from Stable Diffusion with SDS (DreamGaussian's first stage); minutes on a GPU.",
           ("gaussian-sds",), refine_stages=("gaussian-sds-texture",), needs_cuda=True, weights=SD_WEIGHTS,
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="gaussian-sds-analytic", default=True),
    Method("dreamfusion", TEXT, "Text to 3D: DreamFusion (NeRF + SDS)",
           "A NeRF distilled from Stable Diffusion with SDS.",
           ("dreamfusion-sd",), refine_stages=("magic3d-refine",), needs_cuda=True, weights=SD_WEIGHTS,
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="dreamfusion-analytic"),
    Method("prolificdreamer", TEXT, "Text to 3D: ProlificDreamer (VSD)",
           "Variational score distillation (a LoRA learns the scene's score): the slowest and most detailed.",
           ("prolificdreamer",), refine_stages=("prolificdreamer-geometry", "prolificdreamer-texture"), needs_cuda=True,
           weights=SD_WEIGHTS, weights_key="system.guidance.pretrained_model_name_or_path",
           offline_twin="dreamfusion-analytic"),
    Method("mvdream", TEXT, "Text to 3D: MVDream (NeRF)",
           "A NeRF distilled from the multi-view MVDream model: four views denoised together, no multi-face objects.",
           ("mvdream",), needs_cuda=True, weights="MVDream (converted to a diffusers folder)",
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="mvdream-analytic"),
    Method("mvdream-gaussians", TEXT, "Text to 3D: MVDream (Gaussians)",
           "3D Gaussians distilled from the multi-view MVDream model.",
           ("mvdream-gaussians",), needs_cuda=True, weights="MVDream (converted to a diffusers folder)",
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="mvdream-analytic"),
    Method("dreamfusion-if", TEXT, "Text to 3D: DreamFusion with DeepFloyd IF",
           "A NeRF distilled from DeepFloyd IF stage I (64x64, a T5-XXL text encoder).",
           ("dreamfusion-if",), needs_cuda=True, weights="DeepFloyd IF-I-XL + T5-XXL",
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="dreamfusion-analytic"),
    Method("magic3d-if", TEXT, "Text to 3D: Magic3D (DeepFloyd IF, then a mesh)",
           "A NeRF with DeepFloyd IF, then a textured mesh refined with Stable Diffusion at 512x512.",
           ("magic3d-if", "magic3d-refine"), needs_cuda=True, weights=f"DeepFloyd IF-I-XL + T5-XXL, {SD_WEIGHTS}",
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="dreamfusion-analytic"),
    Method("dreamgaussian", IMAGE, "Image to 3D: DreamGaussian (Gaussians, then a mesh)",
           "One photo of an object to 3D Gaussians guided by Zero123, then a textured mesh.",
           ("dreamgaussian-image", "dreamgaussian-image-texture"), needs_cuda=True, weights=ZERO123_WEIGHTS,
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="dreamgaussian-image-analytic",
           default=True),
    Method("zero123-nerf", IMAGE, "Image to 3D: Zero123 NeRF",
           "One photo of an object to a NeRF (and its mesh), distilled from Zero123.",
           ("zero123-nerf",), needs_cuda=True, weights=ZERO123_WEIGHTS,
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="zero123-nerf-analytic"),
    Method("magic123", IMAGE, "Image to 3D: Magic123 (Zero123 and a prompt)",
           "One photo and a prompt: a NeRF guided by Zero123 and Stable Diffusion, then a textured mesh.",
           ("magic123", "magic123-refine"), needs_cuda=True, weights=f"{ZERO123_WEIGHTS}, {SD_WEIGHTS}",
           weights_key="system.guidance.pretrained_model_name_or_path", offline_twin="magic123-analytic",
           prompt="required"),
    Method("triposr", IMAGE, "Image to 3D: TripoSR (feed-forward, seconds)",
           "One photo of an object to a colored mesh in one forward pass of TripoSR (MIT license); --refine then "
           "distills with Zero123 from it.",
           ("triposr",), refine_stages=("triposr-refine",), weights="TripoSR",
           weights_key="system.generator.pretrained_model_name_or_path", offline_twin="triposr-refine-analytic",
           shared_keys=("system.field.",)),
)


def methods(task: str | None = None) -> list[Method]:
    """The methods of ``task`` (every method when None), in the table's order."""
    if task is not None and task not in TASKS:
        raise MethodError(f"unknown task '{task}': tasks are {', '.join(TASKS)}")
    return [m for m in METHODS if task is None or m.task == task]


def method_names(task: str | None = None) -> list[str]:
    return [m.name for m in methods(task)]


def default_method(task: str) -> Method:
    """The method a task uses when none is named."""
    return next(m for m in methods(task) if m.default)


def find_method(name: str | None, task: str | None = None) -> Method:
    """The method called ``name`` (the task's default for None); a name of another task, or no method at all, is a
    ``MethodError`` that lists the methods of the task."""
    if name is None:
        if task is None:
            raise MethodError("name a method or a task")
        return default_method(task)
    found = next((m for m in METHODS if m.name == name), None)
    names = method_names(task)
    if found is not None and (task is None or found.task == task):
        return found
    if found is not None:
        hint = {PHOTOS: "give photos (lift3d reconstruct PATH)", TEXT: 'give a prompt (lift3d generate "PROMPT")',
                IMAGE: "give a photo (lift3d generate --image PHOTO)"}[found.task]
        raise MethodError(f"--method {name} makes 3D from {_task_words(found.task)}: {hint}; from "
                          f"{_task_words(task)} the methods are {', '.join(names)}")
    close = difflib.get_close_matches(name, names or method_names(), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise MethodError(f"unknown method '{name}'.{hint} Methods{f' for {_task_words(task)}' if task else ''}: "
                      f"{', '.join(names)}")


def _task_words(task: str | None) -> str:
    return {PHOTOS: "photos", TEXT: "text", IMAGE: "one photo", None: "anything"}[task]


def stage_recipes(method: Method, *, sample: bool = False, on_cpu: bool = False, unbounded: bool = False,
                  refine: bool = False) -> list[str]:
    """The recipes a run of ``method`` trains, in order. Photos methods pick a variant of their one stage: the
    built-in sample scene's (``sample``, else the CPU one on a CPU), on a CPU the CPU budget, for photos of a real
    place (``unbounded``) the contracted scene; refine stages come only with ``refine``."""
    first, *later = method.stages
    if method.task == PHOTOS:
        if sample:
            wanted = ["sample", "cpu"] if on_cpu else ["sample"]
        else:
            wanted = (["unbounded-cpu"] if unbounded and on_cpu else []) + (["unbounded"] if unbounded else [])
            wanted += ["cpu"] if on_cpu else []
        first = next((method.variants[v] for v in wanted if v in method.variants), first)
    return [first, *later, *(method.refine_stages if refine else ())]


def runs_on(method: Method, cuda: bool) -> bool:
    """Whether ``method`` does its job on this machine: everything runs on a CUDA GPU; on a CPU, what needs none."""
    return cuda or not method.needs_cuda


def needs_text(method: Method) -> str:
    """What the method needs, in a few words for menus and tables (e.g. "CUDA GPU, Zero123-XL weights")."""
    parts = ["CUDA GPU" if method.needs_cuda else "CPU or CUDA GPU"]
    if method.weights:
        parts.append(f"{method.weights} weights")
    return ", ".join(parts)
