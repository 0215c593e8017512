"""A tiny Gaussian scene for the viewer tests: a few hundred Gaussians on a ball around the origin (where the
viewer's camera looks), colored by position, written as a 3DGS .ply through lift3d's own writer."""

from pathlib import Path

import torch

from lift3d.gaussians.formats.ply import save_ply
from lift3d.sh import rgb_to_sh


def write_gaussian_ply(path: Path, n: int = 400, radius: float = 0.7, seed: int = 0) -> Path:
    generator = torch.Generator().manual_seed(seed)
    directions = torch.randn(n, 3, generator=generator)
    means = directions / directions.norm(dim=-1, keepdim=True) * radius * torch.rand(n, 1, generator=generator).pow(1 / 3)
    colors = (means / (2 * radius) + 0.5).clamp(0.05, 0.95)
    params = {
        "means": means,
        "log_scales": torch.full((n, 3), 0.09).log(),
        "quats": torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(n, 4).clone(),
        "opacity_logits": torch.full((n,), 3.0),
        "sh0": rgb_to_sh(colors)[:, None, :],
        "shN": torch.zeros(n, 0, 3),
    }
    return save_ply(path, params)
