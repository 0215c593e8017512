"""Mip-NeRF 360's distortion loss on rays with a fixed number of samples each, as a pure function.

For a ray's intervals [s_i, s_i+1] (in a normalized spacing, e.g. step counts over their span) with weights w_i,
``sum_ij w_i w_j |m_i - m_j| + 1/3 sum_i w_i^2 (s_i+1 - s_i)`` (m: midpoints) is smallest when the weight sits in
one short interval: it pulls each ray's mass onto one surface and empties the fog a young field fills space with.
The double sum is taken in O(K) with running sums (the midpoints are sorted).
"""

from __future__ import annotations

import torch
from torch import Tensor


def distortion_loss(edges: Tensor, weights: Tensor) -> Tensor:
    """Distortion [R] of rays whose intervals have sorted ``edges`` [R, K + 1] and ``weights`` [R, K]."""
    if edges.shape[:-1] != weights.shape[:-1] or edges.shape[-1] != weights.shape[-1] + 1:
        raise ValueError(f"edges must be [R, K + 1] for weights [R, K], got {tuple(edges.shape)} and {tuple(weights.shape)}")
    mid = 0.5 * (edges[..., 1:] + edges[..., :-1])
    width = edges[..., 1:] - edges[..., :-1]
    # sum_ij w_i w_j |m_i - m_j| = 2 sum_i w_i (m_i W_<i - (w m)_<i), with W_<i and (w m)_<i sums over j < i
    weight_before = torch.cumsum(weights, dim=-1) - weights
    moment_before = torch.cumsum(weights * mid, dim=-1) - weights * mid
    inter = 2.0 * (weights * (mid * weight_before - moment_before)).sum(-1)
    intra = (weights**2 * width).sum(-1) / 3.0
    return inter + intra
