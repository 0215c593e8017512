"""The analytic multi-view prior: the exact denoiser over tuples of reference views, denoised jointly, as
MVDream denoises the 4 views of one object together, so the multi-view distillation path runs with no
weights (``analytic-multiview``; the offline twin of the ``mvdream`` guidance).

The data distribution is a set of tuples (y_m1, ..., y_mV) of reference images whose cameras are V
views at azimuth offsets of 360/V degrees (for each reference, the references nearest to its direction
turned by k 360/V about the up axis, at its elevation; tuples with a member off by more than
``tuple_tolerance_deg`` are dropped). For the V noisy renders x_v of one object at noise levels a_v the
posterior over tuples is a softmax of sum_v (s_v <x_v, y_mv> - s_v^2 ||y_mv||^2 / 2) / (1 - a_v) with
s_v = sqrt(a_v), and each view's MMSE estimate is the posterior-weighted mean of its tuple members. The
conditional prior keeps tuples whose every member is within ``view_angle_deg`` of its rendered view (at
least the best matching one); the unconditional one is uniform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.cameras import spherical_to_position
from lift3d.config import bounded
from lift3d.guidance.analytic import AnalyticConfig, AnalyticGuidance, guided_noise
from lift3d.guidance.multiview import per_object_timesteps
from lift3d.registry import register


def joint_posterior_mean(x_t: Tensor, tuples: Tensor, alpha_bar: Tensor, log_prior: Tensor | None = None) -> Tensor:
    """E[y | x_t] [B, V, D] for the V views x_t [B, V, D] of B objects, reference tuples [M, V, D],
    alpha_bar [B, V] and log_prior [B, M] (None: uniform)."""
    s = alpha_bar.sqrt()  # [B, V]
    variance = 1 - alpha_bar
    inner = torch.einsum("bvd,mvd->bmv", x_t, tuples)  # <x_bv, y_mv>
    norms = tuples.square().sum(-1)  # [M, V]
    logits = ((s[:, None] * inner - 0.5 * s[:, None] ** 2 * norms[None]) / variance[:, None]).sum(-1)  # [B, M]
    if log_prior is not None:
        logits = logits + log_prior
    weights = torch.softmax(logits, dim=-1)
    return torch.einsum("bm,mvd->bvd", weights, tuples)


def reference_tuples(directions: Tensor, n_views: int, tolerance_deg: float) -> Tensor:
    """Indices [M, V] of reference tuples: for each reference (unit directions [N, 3], +z up), the references
    nearest to its direction turned by k 360/V degrees about +z (k = 0..V-1); tuples with a member farther
    than ``tolerance_deg`` from its ideal direction are dropped."""
    elevation = torch.asin(directions[:, 2].clamp(-1, 1))
    azimuth = torch.atan2(directions[:, 1], directions[:, 0])
    turns = torch.arange(n_views, dtype=directions.dtype) * (2 * math.pi / n_views)
    ideal = spherical_to_position(elevation[:, None].expand(-1, n_views), azimuth[:, None] + turns, torch.ones(1))
    cosine = ideal @ directions.T  # [N, V, N]
    best, index = cosine.max(dim=-1)
    keep = (best >= math.cos(math.radians(tolerance_deg))).all(dim=-1)
    return index[keep]


@dataclass
class AnalyticMultiviewConfig(AnalyticConfig):
    """The exact denoiser over tuples of a posed-image scene's views at fixed azimuth offsets."""

    n_views: int = bounded(4, low=1)  # views of one object denoised together (consecutive renders of a batch, as data.n_views)
    # drop reference tuples with a member farther than this from its ideal direction
    tuple_tolerance_deg: float = bounded(25.0, low=0, high=180)


@register("analytic-multiview")
class AnalyticMultiviewGuidance(AnalyticGuidance):
    """SDS against the joint posterior mean of reference tuples (pixel space, no weights)."""

    Config = AnalyticMultiviewConfig

    def __init__(self, cfg: Any = None, references: tuple[Tensor, Tensor] | None = None) -> None:
        super().__init__(cfg, references)
        tuples = reference_tuples(self.reference_dirs, self.cfg.n_views, self.cfg.tuple_tolerance_deg)
        if len(tuples) == 0:
            raise ValueError(f"no reference tuples of {self.cfg.n_views} views within {self.cfg.tuple_tolerance_deg} degrees of "
                             "fixed azimuth offsets: raise guidance.tuple_tolerance_deg or use a scene with views all around")
        self.register_buffer("tuple_index", tuples, persistent=False)

    def sample_timesteps(self, n: int, device: torch.device) -> Tensor:
        """One timestep per object, shared by its views (as the mvdream guidance)."""
        return per_object_timesteps(super().sample_timesteps, n, self.cfg.n_views, device, "analytic-multiview")

    def tuple_log_prior(self, batch: dict[str, Any], n: int) -> Tensor:
        """[n / V, M]: 0 for tuples whose every member is within view_angle_deg of its view (and the best), else -inf."""
        views = self.cfg.n_views
        dirs = self.view_dirs(batch, n).reshape(n // views, views, 3)
        members = self.reference_dirs[self.tuple_index]  # [M, V, 3]
        cosine = torch.einsum("bvc,mvc->bmv", dirs, members)
        near = (cosine >= math.cos(math.radians(self.cfg.view_angle_deg))).all(dim=-1)
        total = cosine.sum(-1)
        near |= total == total.max(dim=-1, keepdim=True).values
        return torch.where(near, 0.0, float("-inf"))

    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        n, _, height, width = x_t.shape
        views = self.cfg.n_views
        if n % views:  # single evaluation views: the per-view analytic prior
            return super().predict_noise(x_t, t, batch)
        references = self.references_at(height, width)
        tuples = references[self.tuple_index]  # [M, V, D]
        alpha_bar = self.alphas_cumprod[t]
        flat = x_t.flatten(1).reshape(n // views, views, -1)
        grouped_alpha = alpha_bar.reshape(n // views, views)
        uncond = joint_posterior_mean(flat, tuples, grouped_alpha)
        cond = joint_posterior_mean(flat, tuples, grouped_alpha, self.tuple_log_prior(batch, n))
        return guided_noise(x_t, alpha_bar, uncond, cond, self.cfg.guidance_scale)
