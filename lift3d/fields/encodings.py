"""Input encodings: the multiresolution hash grid (Instant-NGP) and the frequency encoding (the spherical-harmonic
encoding of directions is ``lift3d.sh.sh_bases``).

The hash grid's reference math (``hash_grid_encode`` over a table and a ``HashGridLayout``) lives in
``lift3d.fields.hash_reference``; the ``HashGrid`` module here owns the table, progressive level masking and the
choice of backend (plain PyTorch everywhere; a Triton kernel on CUDA, checked against the PyTorch path on first use;
on the CPU a blocked PyTorch twin, ``lift3d.fields.hash_cpu``, bit-identical to the plain path).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.config import bounded, choice, step_count
from lift3d.fields.hash_reference import hash_grid_encode, hash_grid_layout

log = logging.getLogger("lift3d")


@dataclass
class HashGridConfig:
    """Instant-NGP hash-grid parameters and coarse-to-fine level masking."""

    n_levels: int = bounded(16, low=1)  # resolution levels L
    n_features_per_level: int = bounded(2, low=1)  # features F stored per table row
    log2_hashmap_size: int = bounded(19, low=4, high=30)  # rows of a hashed level: 2**T
    base_resolution: int = bounded(16, low=1)  # cells per axis of the coarsest level
    per_level_scale: float = bounded(1.3819128800, low=1)  # resolution growth per level (1.3819: 16 -> 2048 over 16 levels)
    init_scale: float = bounded(1e-4, low=0)  # table entries start uniform in [-init_scale, init_scale]
    # levels active at step 0 for coarse-to-fine (-1: all levels from the start)
    start_level: int = bounded(-1, low=0, allowed=(-1,), example=8)
    update_steps: int = step_count(1000, low=1)  # one more level becomes active every this many steps
    # auto (Triton on CUDA when available, the blocked CPU twin on CPU, else PyTorch), torch, triton
    backend: str = choice("auto", "torch", "triton")


class HashGrid(nn.Module):
    """Multiresolution hash encoding of points in the unit cube -> [N, n_levels * n_features_per_level]."""

    def __init__(self, cfg: HashGridConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layout = hash_grid_layout(cfg.n_levels, cfg.n_features_per_level, cfg.log2_hashmap_size,
                                       cfg.base_resolution, cfg.per_level_scale)
        table = torch.empty(self.layout.n_rows, cfg.n_features_per_level).uniform_(-cfg.init_scale, cfg.init_scale)
        self.table = nn.Parameter(table)
        self.register_buffer("level_mask", torch.ones(self.layout.output_dim), persistent=False)
        self.active_levels = self.layout.n_levels
        self._triton_checked: bool | None = None  # None: not tried yet on this process
        self.set_step(0)

    @property
    def output_dim(self) -> int:
        return self.layout.output_dim

    def set_step(self, step: int) -> None:
        """Activate levels for coarse-to-fine training: start_level + step // update_steps of them."""
        if self.cfg.start_level < 0:
            active = self.layout.n_levels
        else:
            active = min(self.layout.n_levels, self.cfg.start_level + step // max(self.cfg.update_steps, 1))
        if active != self.active_levels:
            self.active_levels = active
            mask = torch.zeros(self.layout.n_levels, self.layout.n_features)
            mask[:active] = 1.0
            self.level_mask.copy_(mask.reshape(-1))

    def _use_triton(self, points: Tensor) -> bool:
        if self.cfg.backend == "torch" or points.device.type != "cuda" or points.requires_grad:
            return False
        if self._triton_checked is None:
            from lift3d.fields import hash_triton

            self._triton_checked = hash_triton.self_check(self.table, self.layout, strict=self.cfg.backend == "triton")
        return self._triton_checked

    def _use_cpu_blocks(self, points: Tensor) -> bool:
        """The blocked CPU lookup: same numbers as the plain path, about twice as fast; no point gradients."""
        return self.cfg.backend == "auto" and points.device.type == "cpu" and not points.requires_grad

    def forward(self, points: Tensor, reuse: Tensor | None = None) -> Tensor:
        """Features [N, L * F] of ``points`` [N, 3] in [0, 1]^3 (outside points are clamped); see ``lookup``."""
        return self.lookup(points, reuse)[1]

    def lookup(self, points: Tensor, reuse: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The features of ``points`` before and after coarse-to-fine level masking, both [N, L * F].

        ``reuse``: the first of these from an earlier lookup of the same points and table (the renderer's
        density-only pass), taken as the values instead of gathering them again where that loses nothing: when
        no table gradient is wanted, or on the Triton path, whose backward needs only the points."""
        points = points.clamp(0.0, 1.0)
        if reuse is not None and not (torch.is_grad_enabled() and self.table.requires_grad):
            encoded = reuse
        elif self._use_triton(points):
            from lift3d.fields.hash_triton import hash_grid_encode_triton

            encoded = hash_grid_encode_triton(points, self.table, self.layout, reuse)
        elif self._use_cpu_blocks(points):
            from lift3d.fields.hash_cpu import hash_grid_encode_cpu

            encoded = hash_grid_encode_cpu(points.to(self.table.dtype), self.table, self.layout)
        else:
            encoded = hash_grid_encode(points.to(self.table.dtype), self.table, self.layout)
        if self.active_levels < self.layout.n_levels:
            return encoded, encoded * self.level_mask
        return encoded, encoded


def frequency_encode(x: Tensor, n_frequencies: int, include_input: bool = True) -> Tensor:
    """[x, sin(2^k pi x), cos(2^k pi x) for k < n_frequencies] -> [..., D * (include_input + 2 n)]."""
    parts = [x] if include_input else []
    if n_frequencies > 0:
        scales = (2.0 ** torch.arange(n_frequencies, device=x.device, dtype=x.dtype)) * math.pi
        angles = (x[..., None, :] * scales[:, None]).flatten(-2)  # [..., n * D], frequency-major
        parts += [torch.sin(angles), torch.cos(angles)]
    return torch.cat(parts, dim=-1)


def frequency_output_dim(input_dim: int, n_frequencies: int, include_input: bool = True) -> int:
    return input_dim * (int(include_input) + 2 * n_frequencies)
