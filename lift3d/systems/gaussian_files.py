"""A Gaussian file made by any tool, as a reconstruct-gaussians system: what ``lift3d export`` converts and meshes, and
what ``lift3d view`` renders, so both read and render a file the same way."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def gaussian_file_system(path: Path, overrides: Sequence[str] = ()) -> tuple[Any, dict[str, torch.Tensor]]:
    """(a reconstruct-gaussians system holding the Gaussians of ``path``, their parameters): every attribute as
    ``load_gaussian_file`` reads it, the file's SH degree, and the 2D filter for a .spz trained with it (its header's
    antialiased flag); ``overrides`` are config overrides on top."""
    from lift3d.config import load_config
    from lift3d.gaussians.formats.files import load_gaussian_file
    from lift3d.gaussians.formats.spz import spz_info
    from lift3d.recipes import recipe_config
    from lift3d.registry import find
    from lift3d.sh import degree_of

    params = load_gaussian_file(path)
    degree = degree_of(params["shN"].shape[1] + 1)
    fixed = [f"system.gaussians.sh_degree={degree}", "system.gaussians.sh_degree_interval=0", "system.gaussians.init=random"]
    if path.suffix.lower() == ".spz" and spz_info(path).antialiased:  # trained with the 2D filter: rendered and written so
        fixed.append("system.renderer.rasterize_mode=antialiased")
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=fixed + list(overrides))
    system = find(cfg.system_type)(cfg.system)
    system.gaussians.set_parameters(params)
    return system, params
