"""``lift3d generate "PROMPT" [--method METHOD] [overrides...]`` (METHOD: gaussian-sds, dreamfusion, prolificdreamer,
mvdream, mvdream-gaussians, dreamfusion-if, magic3d-if): text -> 3D (``magic3d-if``: the DeepFloyd IF NeRF stage,
then the Stable Diffusion mesh stage).

``lift3d generate --image PHOTO [--method dreamgaussian|zero123-nerf|magic123] [--elevation DEG] ["PROMPT"]``:
one photo -> 3D (the method's first stage, then its mesh stage ending in a textured .glb).
``lift3d generate --image PHOTO --method triposr [--refine]``: a feed-forward generator's field in one forward
pass (seconds to a textured .glb); ``--refine`` continues from it with Zero123 distillation.
``lift3d generate --prompts FILE [--method M] [--gpus IDS] [overrides...]`` makes one asset per line of FILE,
sharded across the GPUs (``lift3d.commands.multi_prompt``)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HELP = ("make a 3D asset from a text prompt, or from one photo (--image), by score distillation (needs Stable "
        "Diffusion / Zero123 weights; a GPU is advised)")
METHODS = {  # --method -> recipe config
    "gaussian-sds": "gaussian-sds",
    "dreamfusion": "dreamfusion-sd",
    "prolificdreamer": "prolificdreamer",
    "mvdream": "mvdream",
    "mvdream-gaussians": "mvdream-gaussians",
    "dreamfusion-if": "dreamfusion-if",
    "magic3d-if": "magic3d-if",
}
TEXT_REFINE = {  # text --method -> the mesh stage that follows its first stage
    "magic3d-if": "magic3d-refine",
}
IMAGE_METHODS = {  # --image --method -> (first stage, refine stage)
    "dreamgaussian": ("dreamgaussian-image", "dreamgaussian-image-texture"),
    "zero123-nerf": ("zero123-nerf", ""),
    "magic123": ("magic123", "magic123-refine"),
    "triposr": ("triposr", "triposr-refine"),
}
FEED_FORWARD = ("triposr",)  # --image methods whose refine stage runs only with --refine


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    from lift3d.commands.common import add_viewer_arguments
    from lift3d.commands.multi_prompt import PROMPTS_HELP

    parser.add_argument("prompt", nargs="?", default=None, help='what to make, e.g. "a DSLR photo of a hamburger"')
    parser.add_argument("config", nargs="*", metavar="KEY=VALUE",  # "config": lift3d.cli appends stray overrides there
                        help="config overrides such as trainer.max_steps=500 system.guidance.guidance_scale=50")
    parser.add_argument("--method", choices=[*METHODS, *IMAGE_METHODS], default=None,
                        help="text: gaussian-sds (3D Gaussians, minutes; default), dreamfusion (NeRF + SDS), "
                             "prolificdreamer (NeRF + VSD, slowest, most detail), mvdream / mvdream-gaussians (NeRF / "
                             "Gaussians from the multi-view MVDream model: no multi-face objects; needs its weights), "
                             "dreamfusion-if (NeRF + DeepFloyd IF) or magic3d-if (NeRF with DeepFloyd IF, then a mesh with "
                             "Stable Diffusion); --image: dreamgaussian (Gaussians then a textured mesh; default), "
                             "zero123-nerf (NeRF) or magic123 (NeRF + mesh with Zero123 and "
                             "a text prompt) or triposr (the TripoSR feed-forward model: a .glb in seconds; --refine then "
                             "distils with Zero123 from it)")
    parser.add_argument("--image", metavar="PHOTO", default=None,
                        help="make the asset from this photo (RGBA cut-out, or a photo whose background is removed)")
    parser.add_argument("--elevation", type=float, default=0.0, metavar="DEG",
                        help="--image: the photo's camera elevation above the object's horizon, degrees (default 0)")
    parser.add_argument("--refine", action="store_true",
                        help="--method triposr: refine the generated object with Zero123 distillation (triposr-refine)")
    parser.add_argument("--refine-steps", type=int, default=None, metavar="N",
                        help="--image or magic3d-if: steps of the mesh stage (default: its recipe's; 0 skips it)")
    parser.add_argument("--refine-set", action="append", default=[], metavar="KEY=VALUE",
                        help="--image or magic3d-if: an override for the mesh stage only (repeatable), e.g. "
                             "system.export.texture_size=2048")
    parser.add_argument("--gpus", metavar="IDS", default=None, help="comma-separated GPU ids, e.g. 0")
    parser.add_argument("--prompts", metavar="FILE", default=None, help=PROMPTS_HELP)
    add_viewer_arguments(parser)


def prompt_tag(prompt: str, limit: int = 48) -> str:
    """A folder-safe tag from the prompt: ``"A DSLR photo of a hamburger!"`` -> ``a_DSLR_photo_of_a_hamburger``."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", prompt).strip("_")
    return words[:limit].rstrip("_") or "prompt"


def generate_overrides(prompt: str, overrides: list[str]) -> list[str]:
    """The overrides ``lift3d generate`` adds before the user's (which win): the prompt (quoted, so any
    characters survive the dotlist parser) and a run tag made from it."""
    from lift3d.config import ConfigError

    if not prompt.strip():
        raise ConfigError('give a prompt: lift3d generate "a DSLR photo of a hamburger"')
    if re.fullmatch(r"[A-Za-z_][\w.]*=\S*", prompt):
        raise ConfigError(f"{prompt!r} looks like an override, not a prompt: give the prompt first, "
                          'e.g. lift3d generate "a DSLR photo of a hamburger" trainer.max_steps=500')
    bad = [item for item in overrides if "=" not in item]
    if bad:
        raise ConfigError(f"overrides are KEY=VALUE, got {' '.join(bad)} (quote the prompt if it has spaces)")
    return [f"system.guidance.prompt={json.dumps(prompt)}", f"tag={prompt_tag(prompt)}", *overrides]


def image_overrides(image: str, elevation: float, prompt: str | None) -> list[str]:
    """The overrides ``lift3d generate --image`` adds: the photo, its elevation, a tag, the prompt (magic123)."""
    from lift3d.config import ConfigError

    path = Path(image).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"--image {image}: no such file (give a .png or .jpg of the object)")
    overrides = [f"data.image={json.dumps(str(path))}", f"data.elevation_deg={elevation}", f"tag={prompt_tag(path.stem)}"]
    if prompt:
        overrides.append(f"system.text_guidance.prompt={json.dumps(prompt)}")
    return overrides


def _applies_to(override: str, cfg) -> bool:
    """Whether a KEY=VALUE override names a key the config has (a later stage takes the user's options that fit it)."""
    from omegaconf import OmegaConf

    key = override.split("=", 1)[0].replace("\\.", ".")
    missing = object()
    return not key.startswith("trainer.") and OmegaConf.select(OmegaConf.structured(cfg), key, default=missing) is not missing


def refine_steps(steps: int | None) -> list[str]:
    """Overrides for ``--refine-steps``: the stage's step count, validated once at its end (none without it)."""
    return [f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}"] if steps else []


def without_mesh_exports(config: Path) -> list[str]:
    """An override leaving the mesh formats out of a first stage's exports when a mesh stage follows it: that stage
    builds its own mesh from the first stage's checkpoint, so the first stage's marching cubes, UV atlas and baking
    would only delay the final .glb (minutes at the GPU defaults). The user's own ``system.export.formats`` wins."""
    from lift3d.config import load_config
    from lift3d.export.config import ExportConfig
    from lift3d.export.formats import formats_from

    export = load_config(config).system.get("export") or {}
    formats = list(export.get("formats", ExportConfig().formats))
    kept = [name for name in formats if name not in formats_from("mesh")]
    return [] if kept == formats else [f"system.export.formats=[{','.join(kept)}]"]


def train_stage(config: Path, overrides: list[str], announce: str) -> Path:
    """Load ``config`` with ``overrides``, print ``announce`` (formatted with the step count), train; the run folder."""
    from lift3d.commands.common import training_callbacks
    from lift3d.config import load_config
    from lift3d.runs.runner import run_experiment

    cfg = load_config(config, overrides=overrides)
    print(f"lift3d: {announce.format(steps=cfg.trainer.max_steps)}", flush=True)
    run_dir = run_experiment("train", cfg, [config], overrides, callbacks=training_callbacks)
    print(f"lift3d: results in {run_dir}")
    return run_dir


def analytic_twin(recipe: str, image: bool) -> str:
    """The offline recipe that runs ``recipe``'s pipeline with the analytic prior (no weights, fine on a CPU)."""
    from lift3d.recipes import recipe_names

    names = recipe_names()
    for name in (f"{recipe}-analytic", f"{recipe.rsplit('-', 1)[0]}-analytic"):
        if name in names:
            return name
    return "dreamgaussian-image-analytic" if image else "gaussian-sds-analytic"


def cuda_notice(recipe: str, image: bool) -> str | None:
    """Without a CUDA GPU, one line saying that ``recipe`` runs a diffusion model that needs one, and the offline
    twin that runs on the CPU (None on a CUDA machine or for an analytic recipe)."""
    import torch

    if torch.cuda.is_available() or recipe.endswith("-analytic"):
        return None
    from lift3d.data.sample_scene import sample_scene_path
    from lift3d.recipes import recipe_config

    twin = analytic_twin(recipe, image)
    return (f"{recipe} runs a diffusion model, which needs a CUDA GPU, and torch sees none here: on the CPU each step "
            f"takes seconds to minutes. The offline twin of this pipeline runs on the CPU without weights: lift3d train "
            f"{recipe_config(twin)} data.reference_scene={sample_scene_path()}")


def print_assets(run_dir: Path) -> None:
    for path in sorted((run_dir / "save").glob("it*.*")):
        print(f"  {path}")


def run_image(args: argparse.Namespace, gpus: list[int] | None) -> int:
    """One photo -> 3D: the method's first stage, then its mesh stage from the first stage's checkpoint."""
    from lift3d.commands.common import viewer_overrides
    from lift3d.config import ConfigError, load_config
    from lift3d.recipes import recipe_config

    method = args.method or "dreamgaussian"
    if method not in IMAGE_METHODS:
        raise ConfigError(f"--method {method} makes 3D from text; with --image use one of {', '.join(IMAGE_METHODS)}")
    if method == "magic123" and not (args.prompt and "=" not in args.prompt):
        raise ConfigError('magic123 adds a text prior: give a prompt, e.g. lift3d generate --image photo.png --method magic123 '
                          '"a DSLR photo of a teddy bear"')
    first, refine = IMAGE_METHODS[method]
    if method in FEED_FORWARD and not getattr(args, "refine", False):
        refine = ""
    elif getattr(args, "refine", False) and method not in FEED_FORWARD:
        raise ConfigError(f"--refine continues a feed-forward method ({', '.join(FEED_FORWARD)}); {method} always runs its "
                          "refine stage (skip it with --refine-steps 0)")
    user = list(args.config)
    prompt = args.prompt
    if prompt and re.fullmatch(r"[A-Za-z_][\w.\\]*=.*", prompt):  # argparse hands the first override to the prompt
        user.insert(0, prompt)
        prompt = None
    if prompt and method != "magic123":
        raise ConfigError(f"{method} makes 3D from the photo alone; a prompt is for --method magic123 (got {prompt!r})")
    bad = [item for item in user if "=" not in item]
    if bad:
        raise ConfigError(f"overrides are KEY=VALUE, got {' '.join(bad)}")
    base = image_overrides(args.image, args.elevation, prompt)
    # a feed-forward model runs on the CPU too (slowly); its refinement runs a diffusion model
    notice = cuda_notice(refine or first, image=True) if method not in FEED_FORWARD or refine else None
    if notice:
        print(f"lift3d: warning: {notice}", file=sys.stderr, flush=True)
    devices = [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu"] if gpus is not None else []
    devices += viewer_overrides(args)  # both stages: the viewer follows the mesh stage too
    config = recipe_config(first)
    announce = f"making 3D from {args.image} with {method} ({config.name}, {{steps}} steps)"
    refining = bool(refine) and args.refine_steps != 0
    # a feed-forward start keeps its .glb: a second's preview while the refinement runs
    trimmed = without_mesh_exports(config) if refining and method not in FEED_FORWARD else []
    run_dir = train_stage(config, [*base, *devices, *trimmed, *user], announce)
    if refining:
        config = recipe_config(refine)
        plain = load_config(config)
        steps = refine_steps(args.refine_steps)
        overrides = [*base, *devices, f"system.geometry_convert_from={run_dir / 'ckpts' / 'last.ckpt'}", *steps,
                     *[item for item in user if _applies_to(item, plain) or _same_field(item, method)], *args.refine_set]
        stage = "refinement" if method in FEED_FORWARD else "mesh stage"
        run_dir = train_stage(config, overrides, f"{stage} {config.name} ({{steps}} steps) from {run_dir}")
    print_assets(run_dir)
    return 0


def _same_field(override: str, method: str) -> bool:
    """Whether an override sets the generated field's config, which its refinement must share (a free-form dict, so
    ``_applies_to`` cannot see its keys)."""
    return method in FEED_FORWARD and override.startswith("system.field.")


def run(args: argparse.Namespace) -> int:
    from lift3d.commands.common import parse_gpus, viewer_overrides
    from lift3d.config import ConfigError
    from lift3d.recipes import recipe_config

    if args.image:
        return run_image(args, parse_gpus(args.gpus))
    if args.prompts:
        from lift3d.commands.multi_prompt import run_prompt_list

        if args.viewer:
            raise ConfigError("--viewer shows one run; it does not go with --prompts (view a finished asset with "
                              "lift3d view RUN)")

        return run_prompt_list(args)
    if args.prompt is None:
        raise ConfigError('give a prompt: lift3d generate "a DSLR photo of a hamburger" (or --prompts FILE, or --image PHOTO)')
    method = args.method or "gaussian-sds"
    if method not in METHODS:
        raise ConfigError(f"--method {method} makes 3D from one photo: add --image PHOTO (text methods: {', '.join(METHODS)})")
    config: Path = recipe_config(METHODS[method])
    overrides = generate_overrides(args.prompt, list(args.config))
    notice = cuda_notice(METHODS[method], image=False)
    if notice:
        print(f"lift3d: warning: {notice}", file=sys.stderr, flush=True)
    gpus = parse_gpus(args.gpus)
    devices = [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu"] if gpus is not None else []
    devices += viewer_overrides(args)  # both stages: the viewer follows the mesh stage too
    announce = f"generating {args.prompt!r} with {method} ({config.name}, {{steps}} steps)"
    refined = method in TEXT_REFINE and args.refine_steps != 0
    trimmed = without_mesh_exports(config) if refined else []
    run_dir = train_stage(config, [*trimmed, *overrides, *devices], announce)
    if refined:
        run_dir = refine_text_stage(TEXT_REFINE[method], run_dir, overrides, devices, args)
    print_assets(run_dir)
    return 0


def refine_text_stage(recipe: str, run_dir: Path, overrides: list[str], devices: list[str], args: argparse.Namespace) -> Path:
    """The mesh stage of a two-stage text method, from the first stage's last checkpoint. It takes the overrides
    that fit its config, except the first stage's guidance settings (another model: only the prompts carry over),
    then ``--refine-steps`` and ``--refine-set``."""
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config

    config = recipe_config(recipe)
    plain = load_config(config)
    carried = [item for item in overrides if _applies_to(item, plain) and _carries_to_refine(item)]
    steps = refine_steps(args.refine_steps)
    later = [*carried, *devices, f"system.geometry_convert_from={run_dir / 'ckpts' / 'last.ckpt'}", *steps, *args.refine_set]
    return train_stage(config, later, f"mesh stage {config.name} ({{steps}} steps) from {run_dir}")


def _carries_to_refine(override: str) -> bool:
    """Whether a first-stage override also applies to a refine stage with a different guidance model."""
    key = override.split("=", 1)[0].replace("\\.", ".")
    return not key.startswith("system.guidance.") or key in ("system.guidance.prompt", "system.guidance.negative_prompt")
