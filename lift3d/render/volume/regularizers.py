"""Regularizers on volume renders, as pure functions of the renderer's outputs."""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.render.volume.compositing import accumulate


def orientation_loss(weights: Tensor, normals: Tensor, directions: Tensor, n_rays: int) -> Tensor:
    """Ref-NeRF/DreamFusion orientation penalty sum_i w_i max(0, n_i . d)^2 per ray, averaged over rays.

    Penalises visible normals that face away from the camera. ``weights`` [S]; ``normals`` and
    ``directions`` (ray directions, camera into the scene) [S, 3] (the renderer's ``weights``,
    ``sample_normals`` and ``sample_directions``)."""
    penalty = weights * (normals * directions).sum(-1).clamp_min(0.0) ** 2
    return penalty.sum() / max(n_rays, 1)


def opacity_sparsity(alpha: Tensor) -> Tensor:
    """Mean accumulated opacity (pushes empty space to zero)."""
    return alpha.mean()


def opacity_entropy(alpha: Tensor, eps: float = 1e-5) -> Tensor:
    """Mean binary entropy of accumulated opacity (pushes each ray's alpha to 0 or 1)."""
    a = alpha.clamp(eps, 1 - eps)
    return (-a * torch.log(a) - (1 - a) * torch.log(1 - a)).mean()


def depth_variance(weights: Tensor, t: Tensor, ray_indices: Tensor, n_rays: int, alpha_min: float = 0.5) -> Tensor:
    """Variance of the sample distances along each ray under its weights, averaged over rays whose
    opacity exceeds ``alpha_min`` (Magic3D/threestudio's z-variance: pulls each ray's mass onto one surface).

    ``weights``, ``t`` (sample distances) and ``ray_indices`` (ascending) are the renderer's per-sample [S] outputs."""
    alpha, weighted_t = accumulate(torch.stack([weights, weights * t], dim=-1), ray_indices, n_rays).unbind(-1)
    mean = weighted_t / alpha.clamp_min(1e-6)
    spread = accumulate(weights * (t - mean[ray_indices]) ** 2, ray_indices, n_rays) / alpha.clamp_min(1e-6)
    mask = (alpha > alpha_min).to(spread.dtype)
    return (spread * mask).sum() / mask.sum().clamp_min(1.0)
