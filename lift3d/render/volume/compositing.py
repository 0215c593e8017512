"""Front-to-back volume compositing over packed (ragged) samples, as pure functions.

Samples of all rays live in flat arrays ``[S]`` with ``ray_indices [S]``, in ascending ray order; each ray's
samples are contiguous and ordered front to back. Transmittance is an exclusive per-ray cumulative sum of optical
thickness ``sigma * delta``, computed in float64 so long packed arrays do not lose precision.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def segment_starts(ray_indices: Tensor) -> Tensor:
    """Index [S] of the first sample of each sample's ray segment (samples grouped by ray).

    Segment ids are a cumulative count of segment starts; a table indexed by segment id holds each start.
    (A cummax over start positions does the same with one kernel, but its scan also computes argmax
    indices, which cost more.)"""
    n = ray_indices.shape[0]
    positions = torch.arange(n, device=ray_indices.device)
    is_first = torch.ones(n, dtype=torch.bool, device=ray_indices.device)
    if n > 1:
        is_first[1:] = ray_indices[1:] != ray_indices[:-1]
    segment = torch.cumsum(is_first, dim=0) - 1
    table = torch.empty(n + 1, dtype=positions.dtype, device=positions.device)
    table.scatter_(0, torch.where(is_first, segment, n), positions)  # non-starts all write the spare last slot
    return table[segment]


def _exclusive_segment_cumsum(values: Tensor, starts: Tensor) -> Tensor:
    total = torch.cumsum(values.double(), dim=0)
    exclusive = total - values.double()
    return (exclusive - exclusive[starts]).to(values.dtype)


class _ExclusiveSegmentCumsum(torch.autograd.Function):
    """Forward: the exclusive per-segment cumsum. Backward: the same sum taken back to front (each sample's
    gradient is the sum of the gradients of the later samples of its ray), so autograd never scatters
    into the gathered segment starts (a sort-based index backward, ~10x slower on CUDA)."""

    @staticmethod
    def forward(ctx, values: Tensor, ray_indices: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(ray_indices)
        return _exclusive_segment_cumsum(values, segment_starts(ray_indices))

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (ray_indices,) = ctx.saved_tensors
        flipped = ray_indices.flip(0)
        return _exclusive_segment_cumsum(grad.flip(0), segment_starts(flipped)).flip(0), None


def exclusive_segment_cumsum(values: Tensor, ray_indices: Tensor) -> Tensor:
    """Per-ray sum of ``values`` [S] over the samples before each sample (float64 accumulation)."""
    if values.shape[0] == 0:
        return values.clone()
    return _ExclusiveSegmentCumsum.apply(values, ray_indices)


# A sample this thick is opaque in float32 (alpha = 1 - 9e-14 rounds to 1, and so does its gradient's factor to 0).
# Larger values change no render, but an infinite one (a density's exp overflowing) made every later ray's
# transmittance NaN, and a huge one (1e30) took the precision of the running sum that all rays share.
MAX_OPTICAL_THICKNESS = 30.0


def render_weights(sigma_delta: Tensor, ray_indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Weights w_i = T_i * alpha_i [S], transmittance T_i (before sample i) [S] and alpha_i [S].

    ``sigma_delta`` [S] is each sample's optical thickness density * interval length (>= 0), used up to
    ``MAX_OPTICAL_THICKNESS``."""
    sigma_delta = sigma_delta.clamp(max=MAX_OPTICAL_THICKNESS)
    alpha = 1.0 - torch.exp(-sigma_delta)
    transmittance = torch.exp(-exclusive_segment_cumsum(sigma_delta, ray_indices))
    return transmittance * alpha, transmittance, alpha


class _SegmentSums(torch.autograd.Function):
    """Forward: per-ray sums as differences of one float64 running sum over all channels laid end to end (a single
    device-wide scan; the channels' offsets cancel in each difference), taken at each ray's first and one-past-last
    sample, found by binary search. ``index_add`` adds with atomics, which serialize where many samples share a ray,
    above all a budget's padding, which all belongs to the last ray. Backward: a gather."""

    @staticmethod
    def forward(ctx, values: Tensor, ray_indices: Tensor, n_rays: int) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(ray_indices)
        n, channels = values.shape[0], math.prod(values.shape[1:])
        rays = torch.arange(n_rays, device=values.device, dtype=ray_indices.dtype)
        bounds = torch.stack([torch.searchsorted(ray_indices, rays), torch.searchsorted(ray_indices, rays, right=True)])
        laid_out = values.reshape(n, channels).t().to(torch.float64, memory_format=torch.contiguous_format).reshape(-1)
        running = torch.cat([laid_out.new_zeros(1), torch.cumsum(laid_out, dim=0)])
        at = bounds[:, None, :] + torch.arange(channels, device=values.device)[None, :, None] * n  # [2, C, R]
        sums = running[at[1]] - running[at[0]]
        return sums.t().to(values.dtype).reshape((n_rays,) + tuple(values.shape[1:]))

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (ray_indices,) = ctx.saved_tensors
        return grad[ray_indices], None, None


def accumulate(values: Tensor, ray_indices: Tensor, n_rays: int) -> Tensor:
    """Per-ray sums [R, C] of per-sample ``values`` [S, C] (or [R] for values [S]); ``ray_indices`` ascending (samples
    grouped by ray in ray order, as the renderer's samplers emit them), rays without samples sum to 0."""
    return _SegmentSums.apply(values, ray_indices, n_rays)
