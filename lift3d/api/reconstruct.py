"""``lift3d.reconstruct(path, method=...)``: photos (posed or not), a video, or the built-in sample scene -> a trained run."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from lift3d.api.overrides import as_overrides, devices_overrides, gpu_ids
from lift3d.api.run import Run
from lift3d.method_table import PHOTOS, find_method, stage_recipes

log = logging.getLogger("lift3d")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def reconstruct(path: str | Path | None = None, method: str = "gaussians", *, gpus: Iterable[int] | str | None = None,
                nodes: int | None = None, overrides: Sequence[str] = (), callbacks: Callable[..., Any] | None = None,
                poses: str = "auto", **settings: Any) -> Run:
    """Reconstruct a scene and return its run.

    ``path``: a posed capture (COLMAP, nerfstudio / instant-ngp ``transforms.json``, Blender), a folder of photos or a
    video (posed first by ``poses``: sfm, vggt or auto, as ``lift3d poses --method``), or None for the built-in sample
    scene. ``method``: a photos method of ``lift3d.methods()`` (``gaussians``, ``nerf``, ``surfels``). Without a CUDA GPU
    the method's CPU recipe runs. ``gpus``: GPU ids to train on (or ``"all"``; several train the same result sooner),
    ``nodes``: machines the run spans. Config overrides come as ``settings`` by dotted key
    (``**{"trainer.max_steps": 500}`` or ``trainer__max_steps=500``) or as ``key=value`` strings in ``overrides``.

    >>> run = lift3d.reconstruct()            # doctest: +SKIP
    >>> run.psnr, run.export("spz")           # doctest: +SKIP
    """
    from lift3d.config import load_config
    from lift3d.data import formats
    from lift3d.data.capture import SceneFormatError
    from lift3d.data.learned_poses import learned_pose_overrides
    from lift3d.data.sample_scene import sample_scene_path
    from lift3d.data.scene import detect
    from lift3d.generators.vggt import prepare_with_poses
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment
    from lift3d.runs.trainer_checks import check_devices

    chosen = find_method(method, PHOTOS)
    ids = gpu_ids(gpus)
    if ids is not None:  # before structure from motion, which may take minutes
        check_devices("gpu", ids)
    devices = devices_overrides(ids, nodes)
    user = as_overrides(settings, overrides)
    bad = [item for item in user if "=" not in item]
    if bad:
        raise SceneFormatError(f"give one scene folder, got more: {' '.join(bad)} (overrides need key=value)")
    scene = Path(path).expanduser().resolve() if path is not None else sample_scene_path()
    found = formats.detect(scene)
    if found is None or not found.posed:  # a video or a folder of photos without poses: structure from motion first
        scene = prepare_with_poses(scene, poses)
        found = detect(scene)  # a folder lift3d cannot read fails here, with the formats it accepts
    if path is None:
        log.info("no scene given; reconstructing the built-in sample scene (%s)", scene)
    on_cpu = not devices and not cuda_available()
    recipe = stage_recipes(chosen, sample=path is None, on_cpu=on_cpu, unbounded=not found.object_centric)[0]
    config = recipe_config(recipe)
    if on_cpu and recipe != chosen.stages[0]:
        log.info("no CUDA GPU: using the CPU budget of %s (smaller images, fewer steps); override it like any config key, "
                 "e.g. trainer.max_steps=...", config.name)
    extra = [f"data.root={scene}", f"tag={scene.name}", *learned_pose_overrides(scene, config), *devices, *user]
    cfg = load_config(config, overrides=extra)
    return Run(run_experiment("train", cfg, [config], extra, callbacks=callbacks))
