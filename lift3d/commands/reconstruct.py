"""``lift3d reconstruct [PATH] [--method gaussians|nerf] [overrides...]``: photos -> 3D in one command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _help() -> str:
    from lift3d.commands.tables import capture_format_lists  # the format table, read without importing torch

    posed, unposed = capture_format_lists()
    return (f"reconstruct a scene from photos: a posed folder ({posed}), {unposed} "
            "(poses by structure from motion); with no path, the built-in sample scene")


HELP = _help()
METHODS = ("gaussians", "nerf")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    from lift3d.commands.common import add_viewer_arguments

    parser.add_argument("config", nargs="*", metavar="[PATH] [KEY=VALUE ...]",
                        help="scene folder, photo folder or video, then config overrides such as trainer.max_steps=7000")
    parser.add_argument("--method", choices=METHODS, default="gaussians",
                        help="representation: gaussians (3D Gaussian Splatting) or nerf (default: gaussians)")
    parser.add_argument("--gpus", metavar="IDS", default=None, help="comma-separated GPU ids, e.g. 0")
    add_viewer_arguments(parser)


def recipe_for(method: str, sample: bool, on_cpu: bool = False, unbounded: bool = False) -> Path:
    """``configs/reconstruct-<method>.yaml`` or the first of its variants that exists and fits: ``-sample`` for
    the built-in scene; for a user's scene ``-unbounded-cpu``, ``-unbounded`` (photos that show the world
    around the object), ``-cpu`` (a budget that finishes in minutes on a machine without a CUDA GPU)."""
    from lift3d.config import ConfigError
    from lift3d.recipes import recipe_config, recipe_names

    names = recipe_names()
    base = f"reconstruct-{method}"
    if sample:
        variants = ["sample"]
    else:
        variants = (["unbounded-cpu"] if unbounded and on_cpu else []) + (["unbounded"] if unbounded else [])
        variants += ["cpu"] if on_cpu else []
    for variant in variants:
        if f"{base}-{variant}" in names:
            return recipe_config(f"{base}-{variant}")
    if base not in names:
        raise ConfigError(f"--method {method} needs the recipe configs/{base}.yaml, which this lift3d does not "
                          f"have (recipes: {', '.join(names) or 'none'}); try --method gaussians")
    return recipe_config(base)


def is_unbounded(layout: str) -> bool:
    """Whether photos of format ``layout`` show the world around the object: every format but the object-centric
    ones (renders of an object on a transparent background) comes from a camera in a real place."""
    from lift3d.data.formats import is_object_centric

    return not is_object_centric(layout)


def _summary(run_dir: Path) -> list[str]:
    save = run_dir / "save"
    lines = [f"lift3d: results in {run_dir}"]
    metrics = save / "metrics.json"
    if metrics.is_file():
        record = json.loads(metrics.read_text())
        val = record.get("val")
        if val:
            lines.append(f"  val PSNR {val['psnr']:.2f} dB, SSIM {val['ssim']:.4f} over {val['views']} views "
                         f"at step {val['step']}  ({metrics})")
    for pattern in ("*.ply", "*.mp4"):
        lines += [f"  {path}" for path in sorted(save.glob(pattern))]
    return lines


def run(args: argparse.Namespace) -> int:
    import torch

    from lift3d.commands.common import parse_gpus, training_callbacks, viewer_overrides
    from lift3d.config import load_config
    from lift3d.data import formats
    from lift3d.data.capture import SceneFormatError
    from lift3d.data.sample_scene import sample_scene_path
    from lift3d.data.scene import detect
    from lift3d.data.sfm import prepare_capture
    from lift3d.runs.runner import run_experiment
    from lift3d.runs.trainer_checks import check_devices

    paths = [item for item in args.config if "=" not in item]
    overrides = [item for item in args.config if "=" in item]
    if len(paths) > 1:
        raise SceneFormatError(f"give one scene folder, got {len(paths)}: {' '.join(paths)} (overrides need key=value)")
    if args.gpus is not None:  # before structure from motion, which may take minutes
        check_devices("gpu", parse_gpus(args.gpus))
    scene = Path(paths[0]).expanduser().resolve() if paths else sample_scene_path()
    found = formats.detect(scene)
    if found is None or not found.posed:  # a video or a folder of photos without poses: structure from motion first
        scene = prepare_capture(scene)
        found = detect(scene)  # a folder lift3d cannot read fails here, with the formats it accepts
    if not paths:
        print(f"lift3d: no scene given; reconstructing the built-in sample scene ({scene})", flush=True)
    gpus = parse_gpus(args.gpus)
    on_cpu = gpus is None and not torch.cuda.is_available()
    config = recipe_for(args.method, sample=not paths, on_cpu=on_cpu, unbounded=not found.object_centric)
    if on_cpu and config.stem.endswith("-cpu"):
        print(f"lift3d: no CUDA GPU: using the CPU budget of {config.name} (smaller images, fewer steps); "
              "override it like any config key, e.g. trainer.max_steps=...", flush=True)
    extra = [f"data.root={scene}", f"tag={scene.name}", *viewer_overrides(args)]
    if gpus is not None:
        extra += [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu"]
    overrides = extra + overrides
    cfg = load_config(config, overrides=overrides)
    run_dir = run_experiment("train", cfg, [config], overrides, callbacks=training_callbacks)
    print("\n".join(_summary(run_dir)))
    return 0
