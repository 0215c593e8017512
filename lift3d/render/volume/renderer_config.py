"""The volume renderer's configuration and its checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lift3d.config.checks import check_minimums
from lift3d.render.volume.occupancy import OccupancyGridConfig
from lift3d.render.volume.proposal import ProposalConfig


@dataclass
class VolumeRendererConfig:
    """How rays are sampled and composited."""

    # occupancy (Instant-NGP marching with empty-space skipping), importance (NeRF-style) or proposal (nerfacto)
    sampler: str = "occupancy"
    proposal: ProposalConfig = field(default_factory=ProposalConfig)  # sampler proposal: networks and samples (proposal.py)
    steps_per_diagonal: int = 1024  # occupancy: marching step = box diagonal / this
    occupancy: OccupancyGridConfig = field(default_factory=OccupancyGridConfig)  # the grid (also masks importance samples)
    early_stop_eps: float = 1e-4  # occupancy: drop samples once transmittance falls below this (0: keep all)
    alpha_threshold: float = 0.0  # occupancy: drop samples with opacity below this (0: keep all)
    n_samples: int = 64  # importance: stratified samples per ray
    n_importance: int = 64  # importance: extra samples per ray drawn from the stratified weights
    near_plane: float = 0.0  # no sample closer to the ray origin than this
    far_plane: float = 1000.0  # unbounded (contracted) fields: no sample farther than this, scene units
    # unbounded fields: fixed steps up to this distance, then evenly spaced in 1/distance (Mip-NeRF 360)
    disparity_from: float = 0.0
    randomized: bool = True  # jitter samples while training (stratified sampling)
    # rays per chunk while training (bounds the marching candidates' memory; -1: 262144 on CUDA, 32768 on CPU; 0: one
    # chunk); every chunk's budget is sized for the densest chunk seen, so on CUDA few, large chunks are best
    train_chunk_rays: int = -1
    eval_chunk_rays: int = -1  # rays per chunk when not training (-1: 65536 on CUDA, 16384 on CPU)
    eval_field_chunk: int = -1  # samples per field call when not training (-1: 262144 on CUDA, 16384 on CPU)
    sample_budget: str = "auto"  # auto (fixed budgets while training on CUDA: no host sync), always, never (exact)
    budget_margin: float = 1.25  # budgets are this times the sample counts seen recently
    # with budgets: at most this many full-field samples a chunk of training rays, the rays past it left out of the
    # loss (Instant-NGP's fixed sample batch: early, foggy steps cost no more than later ones; 0: no limit)
    max_train_samples: int = 0
    # on the CPU without budgets: density-only pass this many steps at a time, skipping rays already opaque (0: one
    # pass; CUDA: one pass, as each segment waits for the GPU twice)
    march_segment: int = 32
    # with march_segment (CPU only): the segment pass evaluates the whole field and keeps its outputs, no second pass
    # (auto: do so; never: density-only segments, then a second pass)
    fuse_field_pass: str = "auto"
    # auto: the density-only pass keeps the field's encoding (hash-grid features) of the samples it keeps and the full
    # pass reuses it instead of looking it up again (the same values and gradients); never: look up twice
    reuse_encoding: str = "auto"
    # auto: on CUDA, bounded fields' marching candidates (step, box, occupied cell) come from one Triton kernel
    # (march_triton), the PyTorch ops' mask but for the rare midpoint on a cell face; never: the PyTorch ops
    fused_march: str = "auto"


def check_config(c: Any) -> None:
    """Raise ValueError naming the first renderer setting out of its range."""
    if c.sampler not in ("occupancy", "importance", "proposal"):
        raise ValueError(f"renderer sampler must be occupancy, importance or proposal, got '{c.sampler}'")
    if c.sample_budget not in ("auto", "always", "never"):
        raise ValueError(f"renderer sample_budget must be auto, always or never, got '{c.sample_budget}'")
    if c.fuse_field_pass not in ("auto", "never"):
        raise ValueError(f"renderer fuse_field_pass must be auto or never (segment marching runs on the CPU only), "
                         f"got '{c.fuse_field_pass}'")
    if c.reuse_encoding not in ("auto", "never"):
        raise ValueError(f"renderer reuse_encoding must be auto or never, got '{c.reuse_encoding}'")
    if c.fused_march not in ("auto", "never"):
        raise ValueError(f"renderer fused_march must be auto or never, got '{c.fused_march}'")
    check_minimums("system.renderer", c, {
        "steps_per_diagonal": (1, 1024), "n_samples": (1, 64), "n_importance": (0, 64), "march_segment": (0, 32),
        "train_chunk_rays": (0, 32768, (-1,)), "eval_chunk_rays": (1, 16384, (-1,)), "eval_field_chunk": (1, 16384, (-1,)),
    })
    check_minimums("system.renderer.occupancy", c.occupancy, {"resolution": (1, 128), "update_every": (1, 16),
                                                              "warmup_steps": (0, 256), "eval_chunk": (1, 262144)})
    if c.max_train_samples < 0:
        raise ValueError(f"renderer max_train_samples must be >= 0 (0: no limit), got {c.max_train_samples}")
    if c.disparity_from < 0 or c.far_plane <= c.near_plane:
        raise ValueError(f"renderer needs disparity_from >= 0 and far_plane > near_plane, got {c.disparity_from}, "
                         f"{c.far_plane}, {c.near_plane}")
