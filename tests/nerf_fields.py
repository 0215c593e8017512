"""Analytic fields for renderer tests: densities whose renders can be computed by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


class AnalyticField(nn.Module):
    """Density from a function of world points; features are a constant color; normals are -grad density."""

    def __init__(self, density_fn, radius: float = 1.0, color=(0.2, 0.6, 0.9)) -> None:
        super().__init__()
        self.density_fn = density_fn
        self.register_buffer("bbox", torch.tensor([[-radius] * 3, [radius] * 3]))
        self.register_buffer("color", torch.tensor(color))
        self.calls = 0  # points evaluated by forward (with gradients), to check that skipping skips

    def density(self, points: Tensor) -> Tensor:
        return self.density_fn(points)

    def forward(self, points: Tensor, with_normal: bool = False) -> dict[str, Tensor]:
        self.calls += points.shape[0]
        out = {"density": self.density_fn(points), "features": torch.logit(self.color).expand(points.shape[0], 3)}
        if with_normal:
            with torch.enable_grad():
                p = points.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(self.density_fn(p).sum(), p)
            out["normal"] = F.normalize(-g, dim=-1)
        return out


def ball(radius: float, sigma: float):
    """Density sigma inside a ball of ``radius`` at the origin, 0 outside."""
    return lambda p: torch.where(p.norm(dim=-1) < radius, torch.full_like(p[:, 0], sigma), torch.zeros_like(p[:, 0]))


def slab(half_width: float, sigma: float, sharpness: float = 500.0):
    """Density about sigma where |z| < half_width, falling off smoothly (so it has a gradient) outside."""
    return lambda p: sigma * torch.sigmoid((half_width - p[:, 2].abs()) * sharpness)


def uniform(sigma: float):
    return lambda p: torch.full_like(p[:, 0], sigma)


@pytest.fixture(scope="module")
def single_thread():
    """Tiny tensors run far faster on one intra-op thread on a shared 2-core machine (no OpenMP contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
