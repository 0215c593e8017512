"""Where rays are sampled, as pure functions: box intersection, marching steps, compaction, importance.

Marching follows Instant-NGP: a fixed step ``dt`` from where the ray enters the box, offset by a
per-ray jitter (stratified sampling), with every step whose midpoint falls in an empty occupancy cell
dropped. For unbounded scenes steps grow with distance: ``dt`` up to ``disparity_from``, then evenly spaced in
inverse distance (Mip-NeRF 360), which reaches infinity in as many steps again. Steps are compacted into packed
arrays either exactly (``nonzero``: one host sync) or into a fixed budget (cumsum + scatter: no host sync, static
shapes; rays that do not fit are reported); on CUDA by a Triton kernel (``pack_triton``), checked here against the
PyTorch ops before use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from lift3d.triton_checks import checked_once


def ray_box(rays_o: Tensor, rays_d: Tensor, bbox: Tensor, near: float = 0.0) -> tuple[Tensor, Tensor]:
    """Entry and exit distances [R] of rays [R, 3] through the box ``bbox`` [2, 3] (exit <= entry: miss)."""
    inv = 1.0 / torch.where(rays_d.abs() < 1e-12, torch.full_like(rays_d, 1e-12), rays_d)
    t0 = (bbox[0] - rays_o) * inv
    t1 = (bbox[1] - rays_o) * inv
    t_near = torch.minimum(t0, t1).amax(dim=-1).clamp_min(near)
    t_far = torch.maximum(t0, t1).amin(dim=-1)
    return t_near, t_far


def step_index(t: Tensor, step_size: float, disparity_from: float = 0.0) -> Tensor:
    """Continuous step count from distance 0 to distance ``t``: ``t / dt``, or with ``disparity_from`` = K > 0
    ``t / dt`` up to K and ``(K / dt) (2 - K / t)`` beyond (steps evenly spaced in 1 / t, Mip-NeRF 360), which
    tends to ``2 K / dt``: infinity is that many steps away."""
    if disparity_from <= 0:
        return t / step_size
    knee = disparity_from
    return torch.where(t <= knee, t / step_size, knee / step_size * (2 - knee / t.clamp_min(knee)))


def step_distance(u: Tensor, step_size: float, disparity_from: float = 0.0) -> Tensor:
    """The inverse of ``step_index``: distance of continuous step count ``u`` (at most a million times K)."""
    if disparity_from <= 0:
        return u * step_size
    knee = disparity_from
    fraction = u * step_size / knee
    return torch.where(fraction <= 1, u * step_size, knee / (2 - fraction.clamp(1, 2 - 1e-6)))


def step_bounds(t_near: Tensor, t_far: Tensor, jitter: Tensor, step_size: float, k: Tensor,
                disparity_from: float = 0.0) -> tuple[Tensor, Tensor]:
    """Interval [lo, hi] of marching step ``k`` (broadcast with the per-ray tensors): steps tile [t_near, t_far]
    with boundaries at step counts u(t_near) + k + jitter, jitter in (0, 1] (``step_index``: t_near + (k +
    jitter) * dt with fixed steps); lo >= hi means no such step."""
    if disparity_from <= 0:
        lo = torch.maximum(t_near, t_near + (k - 1 + jitter) * step_size)
        hi = torch.minimum(t_far, t_near + (k + jitter) * step_size)
        return lo, hi
    start = step_index(t_near, step_size, disparity_from) + jitter
    lo = torch.maximum(t_near, step_distance(start + k - 1, step_size, disparity_from))
    hi = torch.minimum(t_far, step_distance(start + k, step_size, disparity_from))
    return lo, hi


def n_marching_steps(max_chord: float, step_size: float) -> int:
    """Steps needed to cover a chord of length ``max_chord`` (or ``max_chord`` step counts, with a step size
    of 1) with any jitter."""
    return int(math.ceil(max_chord / step_size)) + 1


@dataclass
class Packed:
    """Compacted positions into a flat candidate array."""

    index: Tensor  # [S] index into the candidate array (padding repeats the last candidate)
    valid: Tensor | None  # [S] False for padding (None: every entry is real)
    dropped: Tensor | None  # [n_candidates] True for selected candidates that did not fit the budget


def compact(mask: Tensor, budget: int | None = None, fused: bool | None = None) -> Packed:
    """Positions of the True entries of ``mask`` [n] in order: exactly, or into ``budget`` slots (on CUDA by one
    Triton kernel, ``pack_triton``, unless ``fused`` is False; the same result)."""
    if fused is None and mask.is_cuda:  # checked on the first call, which comes before any graph capture
        fused = compaction_available(mask.device)
    if budget is None:
        return Packed(torch.nonzero(mask).reshape(-1), None, None)
    n = mask.shape[0]
    if fused:
        from lift3d.render.volume.pack_triton import place

        slots, running = place(mask.contiguous(), budget)
        return Packed(slots.clamp_max(max(n - 1, 0)), slots < n, mask & (running > budget))
    position = torch.cumsum(mask.to(torch.int32), dim=0) - 1
    keep = mask & (position < budget)
    slot = torch.where(keep, position, torch.full_like(position, budget)).long()
    buffer = torch.full((budget + 1,), n, dtype=torch.long, device=mask.device)
    buffer.scatter_(0, slot, torch.arange(n, device=mask.device))
    index = buffer[:budget]
    valid = index < n
    return Packed(index.clamp_max(max(n - 1, 0)), valid, mask & ~keep)


_COMPACT_CHECKED: dict[torch.device, bool] = {}


def compaction_available(device: torch.device) -> bool:
    """Whether the kernel runs on ``device`` and passed its comparison with the PyTorch compaction there."""
    from lift3d.render.volume import pack_triton

    if pack_triton.triton is None:
        return False
    return checked_once(_COMPACT_CHECKED, device, compare_compaction, "Triton compaction", "the PyTorch ops")


def compare_compaction(device: torch.device) -> None:
    """Raise unless the kernel's compaction is the PyTorch one (budgets below, at and above the selected count)."""
    generator = torch.Generator(device=device).manual_seed(0)
    mask = torch.rand(5000, device=device, generator=generator) < 0.3
    count = int(mask.sum())
    for budget in (count // 2, count, count + 100):
        fast, reference = compact(mask, budget, fused=True), compact(mask, budget, fused=False)
        for a, b in ((fast.index, reference.index), (fast.valid, reference.valid), (fast.dropped, reference.dropped)):
            if not torch.equal(a, b):
                raise RuntimeError("the Triton compaction differs from the PyTorch ops")


def stratified_samples(t_near: Tensor, t_far: Tensor, n_samples: int, jitter: Tensor | None) -> Tensor:
    """``n_samples`` sorted distances [R, n] in [t_near, t_far], one per equal bin (random in it if jitter)."""
    u = torch.full((t_near.shape[0], n_samples), 0.5, device=t_near.device) if jitter is None else jitter
    bins = torch.arange(n_samples, device=t_near.device, dtype=t_near.dtype)
    span = (t_far - t_near).clamp_min(0.0)[:, None]
    return t_near[:, None] + (bins + u) / n_samples * span


def sample_pdf(bins: Tensor, weights: Tensor, n_samples: int, uniform: Tensor | None) -> Tensor:
    """Inverse-CDF samples [R, n] from piecewise-constant densities ``weights`` [R, B] on ``bins`` [R, B + 1]."""
    weights = weights + 1e-5  # every bin keeps a little mass so the CDF is strictly increasing
    pdf = weights / weights.sum(-1, keepdim=True)
    cdf = torch.cat([torch.zeros_like(pdf[:, :1]), torch.cumsum(pdf, -1)], -1).contiguous()
    if uniform is None:
        uniform = torch.linspace(0.0, 1.0, n_samples + 2, device=bins.device)[1:-1].expand(bins.shape[0], n_samples)
    uniform = uniform.contiguous()
    above = torch.searchsorted(cdf, uniform, right=True).clamp(1, cdf.shape[-1] - 1)
    below = above - 1
    cdf_lo, cdf_hi = cdf.gather(-1, below), cdf.gather(-1, above)
    bin_lo, bin_hi = bins.gather(-1, below), bins.gather(-1, above)
    fraction = (uniform - cdf_lo) / (cdf_hi - cdf_lo).clamp_min(1e-8)
    return bin_lo + fraction * (bin_hi - bin_lo)


def intervals_from_points(t: Tensor, t_near: Tensor, t_far: Tensor) -> tuple[Tensor, Tensor]:
    """Intervals [R, K] around sorted sample distances ``t`` [R, K]: midpoints between neighbors, ends at the box."""
    mids = 0.5 * (t[:, 1:] + t[:, :-1])
    lo = torch.cat([t_near[:, None], mids], dim=-1)
    hi = torch.cat([mids, t_far[:, None]], dim=-1)
    hi = torch.maximum(hi, lo)
    return lo, hi
