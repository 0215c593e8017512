"""A brute-force surfel renderer for the tests: every pixel's ray is intersected with every surfel's plane in camera
space (no tiles, no ray transforms, no cofactors), and the surfels are composited one after the other in depth order
with gsplat's 2DGS rules. Differentiable by autograd; slow, for scenes of a few dozen surfels."""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.rotations import quaternion_to_matrix

ALPHA_MAX, ALPHA_MIN, T_MIN = 0.999, 1.0 / 255.0, 1e-4


def reference_render(means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor, viewmats: Tensor,
                     Ks: Tensor, width: int, height: int, centers2d: Tensor,
                     shift: Tensor | None = None, low_pass: float = 2.0) -> dict[str, Tensor]:
    """Per view [C, H, W, *]: ``rgb`` (colors [N, 3], no background), ``alpha``, ``depth_sum``, ``median``,
    ``distortion``, ``normal`` (world). ``centers2d`` [C, N, 2]: the low-pass filter's centers (given: the projection's
    box centers, checked on their own). ``shift`` [C, N, 2]: moves each surfel's plane sideways by that many pixels at
    its depth, leaving its filter center, depth and normal (for the densification gradient). ``low_pass``: the filter's
    sigma_2d = low_pass |pixel - center|^2."""
    rot = quaternion_to_matrix(quats)
    out: dict[str, list[Tensor]] = {k: [] for k in ("rgb", "alpha", "depth_sum", "median", "distortion", "normal")}
    ys, xs = torch.meshgrid(torch.arange(height, dtype=means.dtype) + 0.5, torch.arange(width, dtype=means.dtype) + 0.5,
                            indexing="ij")
    for c in range(len(viewmats)):
        R, t, K = viewmats[c, :3, :3], viewmats[c, :3, 3], Ks[c]
        center = means @ R.T + t  # [N, 3] camera space
        if shift is not None:
            offset = torch.stack([shift[c, :, 0] * center[:, 2] / K[0, 0], shift[c, :, 1] * center[:, 2] / K[1, 1]], -1)
            plane_center = center + torch.cat([offset, torch.zeros_like(offset[:, :1])], dim=-1)
        else:
            plane_center = center
        axes = rot @ torch.zeros(3, 3, dtype=means.dtype).fill_diagonal_(1.0)  # columns t_u, t_v, n (world)
        t_u, t_v, n = (axes[:, :, k] @ R.T for k in range(3))  # camera space
        ray = torch.stack([(xs - K[0, 2]) / K[0, 0], (ys - K[1, 2]) / K[1, 1], torch.ones_like(xs)], -1)  # [H, W, 3]
        ray = ray.reshape(-1, 3)
        facing = (n.neg() * center).sum(-1)  # n . (camera - center) in camera space
        denominator = ray @ n.T  # [P, N]
        hit = denominator != 0
        along = (plane_center * n).sum(-1) / torch.where(hit, denominator, torch.ones_like(denominator))
        point = along[..., None] * ray[:, None, :] - plane_center  # [P, N, 3] from the center, on the plane
        u = (point * t_u).sum(-1) / scales[:, 0]
        v = (point * t_v).sum(-1) / scales[:, 1]
        d2 = (xs.reshape(-1, 1) - centers2d[c, :, 0]) ** 2 + (ys.reshape(-1, 1) - centers2d[c, :, 1]) ** 2
        sigma = 0.5 * torch.minimum(u * u + v * v, low_pass * d2)
        alpha = (opacities * torch.exp(-sigma)).clamp(max=ALPHA_MAX)
        alpha = torch.where(hit & (alpha >= ALPHA_MIN), alpha, torch.zeros_like(alpha))
        order = torch.argsort(center[:, 2].detach(), stable=True)
        alpha, depth = alpha[:, order], center[order, 2]
        world_n = torch.where((facing > 0)[:, None], rot[:, :, 2], -rot[:, :, 2])[order]
        rgb = colors[order]
        # one surfel after the other: a pixel stops before the surfel that would bring its transmittance to T_MIN
        T = torch.ones(alpha.shape[0], dtype=means.dtype)
        done = torch.zeros(alpha.shape[0], dtype=torch.bool)
        weights, befores = [], []
        for k in range(alpha.shape[1]):
            a = torch.where(done, torch.zeros_like(alpha[:, k]), alpha[:, k])
            stops = T * (1 - a) <= T_MIN
            done = done | stops
            a = torch.where(stops, torch.zeros_like(a), a)
            weights.append(a * T)
            befores.append(T)
            T = T * (1 - a)
        w, before = torch.stack(weights, 1), torch.stack(befores, 1)  # [P, N]
        in_front = (w > 0) & (before > 0.5)
        median = torch.zeros(w.shape[0], dtype=means.dtype)
        for k in range(w.shape[1]):
            median = torch.where(in_front[:, k], depth[k].expand_as(median), median)
        gap = depth[None, :, None] - depth[None, None, :]  # d_k - d_j
        earlier = torch.tril(torch.ones(len(depth), len(depth), dtype=torch.bool), diagonal=-1)  # j < k
        distortion = 2 * (w[:, :, None] * w[:, None, :] * gap * earlier).sum((1, 2))
        for key, value in (("rgb", w @ rgb), ("alpha", w.sum(1, keepdim=True)), ("depth_sum", w @ depth[:, None]),
                           ("median", median[:, None]), ("distortion", distortion[:, None]), ("normal", w @ world_n)):
            out[key].append(value.reshape(height, width, -1))
    return {k: torch.stack(v) for k, v in out.items()}
