"""Marching in segments on the CPU: early termination a few steps at a time, skipping rays already opaque, so
nothing behind a surface is evaluated; optionally the whole field in the same pass (no second field pass)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from lift3d.render.volume.compositing import MAX_OPTICAL_THICKNESS, accumulate, render_weights
from lift3d.render.volume.early_stop import EarlyStop


def keep_in_segments(rays_o: Tensor, rays_d: Tensor, lo: Tensor, hi: Tensor, mask: Tensor, segment: int, stop: EarlyStop,
                     evaluate: Callable[[Tensor], dict[str, Tensor]],
                     fields: list[dict[str, Tensor]] | None = None) -> Tensor:
    """Flat indices [S] into the candidates ``mask`` [R, K] (ray-major, in step order) that early termination keeps,
    evaluating ``evaluate(points)["density"]`` ``segment`` steps at a time on the rays whose transmittance is still
    above ``stop.eps``: the same samples as one pass over every candidate, as a sample's transmittance depends only
    on the samples before it.

    With ``fields`` (a list), ``evaluate``'s outputs at the kept samples, in the order of the returned indices, are
    appended to it as one dict."""
    n_rays, n_steps = mask.shape
    limit = -math.log(stop.eps) if stop.eps > 0 else math.inf  # optical depth at which transmittance falls below eps
    depth = torch.zeros(n_rays, device=mask.device)  # optical depth gathered by each ray so far
    kept = []
    for start in range(0, n_steps, segment):
        alive = depth < limit
        if not alive.any():
            break
        block = mask[:, start:start + segment] & alive[:, None]
        width = block.shape[1]
        index = torch.nonzero(block.reshape(-1)).reshape(-1)
        ray, step = torch.div(index, width, rounding_mode="floor"), start + index % width
        lo_s, hi_s = lo[ray, step], hi[ray, step]
        points = rays_o[ray] + rays_d[ray] * (0.5 * (lo_s + hi_s))[:, None]
        out = evaluate(points)
        density = out["density"].detach()
        sigma_delta = (density * (hi_s - lo_s)).clamp(max=MAX_OPTICAL_THICKNESS)  # one running sum serves all rays
        _, transmittance, alpha = render_weights(sigma_delta, ray)
        keep = stop.kept(transmittance * torch.exp(-depth[ray]), alpha, lo_s, hi_s)
        kept.append((ray * n_steps + step)[keep])
        if fields is not None:
            fields.append({key: value[keep] for key, value in out.items()})
        depth = depth + accumulate(sigma_delta.to(depth.dtype), ray, n_rays)
    if not kept:
        return torch.zeros(0, dtype=torch.long, device=mask.device)
    flat, order = torch.sort(torch.cat(kept))
    if fields:
        joined = {key: torch.cat([f[key] for f in fields])[order] for key in fields[0]}
        fields[:] = [joined]
    return flat
