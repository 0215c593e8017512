"""The volume renderer's configuration and its checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lift3d.config import ConfigError, bounded, choice
from lift3d.render.volume.occupancy import OccupancyGridConfig
from lift3d.render.volume.proposal import ProposalConfig


@dataclass
class VolumeRendererConfig:
    """How rays are sampled and composited."""

    # occupancy (Instant-NGP marching with empty-space skipping), importance (NeRF-style) or proposal (nerfacto)
    sampler: str = choice("occupancy", "importance", "proposal")
    proposal: ProposalConfig = field(default_factory=ProposalConfig)  # sampler proposal: networks and samples (proposal.py)
    steps_per_diagonal: int = bounded(1024, low=1)  # occupancy: marching step = box diagonal / this
    occupancy: OccupancyGridConfig = field(default_factory=OccupancyGridConfig)  # the grid (also masks importance samples)
    # occupancy: drop samples once transmittance falls below this (0: keep all)
    early_stop_eps: float = bounded(1e-4, low=0, below=1)
    alpha_threshold: float = bounded(0.0, low=0, below=1)  # occupancy: drop samples with opacity below this (0: keep all)
    n_samples: int = bounded(64, low=1)  # importance: stratified samples per ray
    n_importance: int = bounded(64, low=0)  # importance: extra samples per ray drawn from the stratified weights
    near_plane: float = bounded(0.0, low=0)  # no sample closer to the ray origin than this
    far_plane: float = bounded(1000.0, above=0)  # unbounded (contracted) fields: no sample farther than this, scene units
    # unbounded fields: fixed steps up to this distance, then evenly spaced in 1/distance (Mip-NeRF 360)
    disparity_from: float = bounded(0.0, low=0)
    randomized: bool = True  # jitter samples while training (stratified sampling)
    # rays per chunk while training (bounds the marching candidates' memory; -1: 262144 on CUDA, 32768 on CPU; 0: one
    # chunk); every chunk's budget is sized for the densest chunk seen, so on CUDA few, large chunks are best
    train_chunk_rays: int = bounded(-1, low=0, allowed=(-1,), example=32768)
    # rays per chunk when not training (-1: 65536 on CUDA, 16384 on CPU)
    eval_chunk_rays: int = bounded(-1, low=1, allowed=(-1,), example=16384)
    # samples per field call when not training (-1: 262144 on CUDA, 16384 on CPU)
    eval_field_chunk: int = bounded(-1, low=1, allowed=(-1,), example=16384)
    # auto (fixed budgets while training on CUDA: no host sync), always, never (exact)
    sample_budget: str = choice("auto", "always", "never")
    budget_margin: float = bounded(1.25, above=0)  # budgets are this times the sample counts seen recently
    # with budgets: at most this many full-field samples a chunk of training rays, the rays past it left out of the
    # loss (Instant-NGP's fixed sample batch: early, foggy steps cost no more than later ones; 0: no limit)
    max_train_samples: int = bounded(0, low=0)
    # on the CPU without budgets: density-only pass this many steps at a time, skipping rays already opaque (0: one
    # pass; CUDA: one pass, as each segment waits for the GPU twice)
    march_segment: int = bounded(32, low=0)
    # with march_segment (CPU only): the segment pass evaluates the whole field and keeps its outputs, no second pass
    # (auto: do so; never: density-only segments, then a second pass)
    fuse_field_pass: str = choice("auto", "never")
    # auto: the density-only pass keeps the field's encoding (hash-grid features) of the samples it keeps and the full
    # pass reuses it instead of looking it up again (the same values and gradients); never: look up twice
    reuse_encoding: str = choice("auto", "never")
    # auto: on CUDA, bounded fields' marching candidates (step, box, occupied cell) come from one Triton kernel
    # (march_triton), the PyTorch ops' mask but for the rare midpoint on a cell face; never: the PyTorch ops
    fused_march: str = choice("auto", "never")


def check_config(c: Any) -> None:
    """Refuse settings that disagree with each other (each key's own range is declared on its field)."""
    if c.far_plane <= c.near_plane:
        raise ConfigError(f"system.renderer.far_plane must be greater than near_plane ({c.near_plane}), got {c.far_plane}: "
                          f"e.g. system.renderer.far_plane={max(1000.0, c.near_plane * 10)}")
