"""NeRF-style importance sampling: stratified samples along each ray, then inverse-CDF samples drawn from the
stratified samples' (no-gradient) weights; over an unbounded field the stratified samples are even in step counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lift3d.render.volume.compositing import render_weights
from lift3d.render.volume.occupancy import OccupancyGrid
from lift3d.render.volume.sampling import intervals_from_points, sample_pdf, step_distance, step_index, stratified_samples


def importance_samples(rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, n_samples: int, n_importance: int,
                       density_fn: Callable[[Tensor], Tensor], occupancy: OccupancyGrid, random: bool,
                       spacing: tuple[float, float] | None = None) -> dict[str, Any]:
    """``n_samples`` stratified + ``n_importance`` inverse-CDF samples a ray [R, 3] in [t_near, t_far] [R] -> packed
    samples {"ray", "lo", "hi" [R * K], "valid" (the occupancy grid's mask, if enabled), "ray_ok": None}.

    ``random``: jittered bins and random CDF draws (else bin centers and even draws); ``spacing``: (step size,
    ``disparity_from``) of an unbounded field, whose stratified samples are even in ``step_index``, denser near
    the camera."""
    n_rays, device = rays_o.shape[0], rays_o.device
    n, m = n_samples, n_importance
    t_far = torch.maximum(t_far, t_near)
    jitter = torch.rand(n_rays, n, device=device) if random else None
    if spacing is not None:
        step, knee = spacing
        u = stratified_samples(step_index(t_near, step, knee), step_index(t_far, step, knee), n, jitter)
        t = step_distance(u, step, knee)
    else:
        t = stratified_samples(t_near, t_far, n, jitter)
    ray = torch.arange(n_rays, device=device)
    if m > 0:
        with torch.no_grad():
            lo, hi = intervals_from_points(t, t_near, t_far)
            points = rays_o[:, None] + rays_d[:, None] * t[..., None]
            sigma = density_fn(points.reshape(-1, 3))
            if occupancy.cfg.enabled:
                sigma = torch.where(occupancy.query(points.reshape(-1, 3)), sigma, torch.zeros_like(sigma))
            weights, _, _ = render_weights(sigma * (hi - lo).reshape(-1), ray.repeat_interleave(n))
            edges = torch.cat([lo, hi[:, -1:]], dim=-1)
            uniform = torch.rand(n_rays, m, device=device) if random else None
            extra = sample_pdf(edges, weights.reshape(n_rays, n), m, uniform)
        t = torch.sort(torch.cat([t, extra.detach()], dim=-1), dim=-1).values
    lo, hi = intervals_from_points(t, t_near, t_far)
    k = t.shape[1]
    ray = ray[:, None].expand(n_rays, k).reshape(-1)
    valid = None
    if occupancy.cfg.enabled:
        points = rays_o[:, None] + rays_d[:, None] * (0.5 * (lo + hi))[..., None]
        valid = occupancy.query(points.reshape(-1, 3))
    return {"ray": ray, "lo": lo.reshape(-1), "hi": hi.reshape(-1), "valid": valid, "ray_ok": None}
