"""Early ray termination: a density-only pass over the marching candidates keeps the samples a ray still sees
(transmittance above ``eps``, opacity at least ``alpha_threshold``), so the full field runs on those alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.render.volume.compositing import accumulate, render_weights
from lift3d.render.volume.sampling import Packed, compact

DensityFn = Callable[[Tensor], tuple[Tensor, Tensor | None]]  # points [S, 3] -> density [S], encoding [S, E] or None


@dataclass(frozen=True)
class EarlyStop:
    """Which samples early termination keeps (``eps`` and ``alpha_threshold`` both 0: every candidate)."""

    eps: float  # drop samples once transmittance falls below this
    alpha_threshold: float  # drop samples with opacity below this

    @property
    def active(self) -> bool:
        """Whether marching has a density-only first pass (else every candidate is kept)."""
        return self.eps > 0 or self.alpha_threshold > 0

    def kept(self, transmittance: Tensor, alpha: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
        """Transmittance still above ``eps``, opacity at least ``alpha_threshold``, a non-empty interval."""
        return (transmittance >= self.eps) & (alpha >= self.alpha_threshold) & (hi > lo)


def terminate(rays_o: Tensor, rays_d: Tensor, first: Packed, ray: Tensor, lo: Tensor, hi: Tensor, n_steps: int,
              density_fn: DensityFn, stop: EarlyStop, budget: int | None) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Packed candidates (``first``; ray, ``lo``, ``hi`` [S] of each entry) -> the samples early termination keeps,
    packed again (exactly, or into ``budget`` slots), and the count of kept samples ({"second"} when ``stop`` is
    active).

    The samples: {"ray", "lo", "hi", "valid" (False: padding), "ray_ok" (False: a ray lost samples to a full
    budget), "encoding" (what ``density_fn`` returned besides the density, at the kept samples)}."""
    n_rays = rays_o.shape[0]
    valid = first.valid
    ray_ok = None if first.dropped is None else ~first.dropped.reshape(n_rays, n_steps).any(dim=1)
    counts: dict[str, Tensor] = {}
    encoding = None
    if stop.active:
        with torch.no_grad():
            points = rays_o[ray] + rays_d[ray] * (0.5 * (lo + hi))[:, None]
            density, encoding = density_fn(points)
            sigma_delta = density * (hi - lo)
            if valid is not None:
                sigma_delta = torch.where(valid, sigma_delta, torch.zeros_like(sigma_delta))
            _, transmittance, alpha = render_weights(sigma_delta, ray)
            keep = stop.kept(transmittance, alpha, lo, hi)
            if valid is not None:
                keep = keep & valid
            counts["second"] = keep.sum()
            second = compact(keep, budget)
        if second.dropped is not None:
            lost = accumulate(second.dropped.float(), ray, n_rays) > 0
            ray_ok = ~lost if ray_ok is None else ray_ok & ~lost
        ray, lo, hi, valid = ray[second.index], lo[second.index], hi[second.index], second.valid
        if encoding is not None:
            from lift3d.render.volume.pack_triton import take_rows

            encoding = take_rows(encoding, second.index)
    return {"ray": ray, "lo": lo, "hi": hi, "valid": valid, "ray_ok": ray_ok, "encoding": encoding}, counts
