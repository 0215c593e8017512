"""Proposal-network sampling (Mip-NeRF 360, nerfacto): where along a ray the field is evaluated, decided by small
density-only fields trained to bound the field's own weights.

A ray's samples start evenly spaced in step counts (``lift3d.render.volume.sampling.step_index``: fixed steps up to the
renderer's ``disparity_from``, evenly in inverse distance beyond, so over an unbounded field they reach the far
plane). Each proposal network (a small hash grid and a 16-wide MLP) gives densities at them, whose weights are a
histogram along the ray; the next stage draws its interval edges from that histogram, and the last stage's
edges are where the field itself is evaluated (``n_samples`` a ray). Every ray has the same number of samples in
every stage: no occupancy grid, no host sync, static shapes (the training step can be a CUDA graph), and the
field is evaluated ``n_samples`` times a ray however young and foggy it is.

The proposal networks learn only from the interlevel (histogram) loss: each proposal histogram must hold at least
the field's weight over every interval of the field's samples (the field's weights held constant); the renderer
returns it per ray as "interlevel", and Mip-NeRF 360's distortion loss of the field's weights as "distortion"
(``lift3d.render.volume.distortion``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.base import Updateable
from lift3d.config import ConfigError, bounded, step_count
from lift3d.fields.volume import ImplicitVolume
from lift3d.render.volume.compositing import MAX_OPTICAL_THICKNESS
from lift3d.render.volume.distortion import distortion_loss
from lift3d.render.volume.sampling import sample_pdf, step_distance, step_index


@dataclass
class ProposalConfig:
    """Proposal networks and sample counts (renderer ``sampler: proposal``)."""

    samples: list = bounded([256, 96], low=1)  # samples a ray of each proposal network, coarse to fine
    n_samples: int = bounded(48, low=1)  # samples a ray where the field itself is evaluated
    resolutions: list = bounded([128, 256], low=16)  # finest hash-grid cells per axis of each network
    n_levels: int = bounded(5, low=1)  # hash-grid levels of each network, from 16 cells per axis up to its resolution
    log2_hashmap_size: int = bounded(17, low=1, high=30)  # rows of each network's hashed levels: 2**this
    hidden_dim: int = bounded(16, low=1)  # width of each network's MLP
    # added to every bin of a proposal histogram before drawing from it (keeps every interval reachable)
    histogram_padding: float = bounded(0.01, low=0)
    # proposal weights are raised to a power rising from 0 (uniform) to 1 over these training steps
    anneal_steps: int = step_count(1000)
    # how fast that power rises (nerfacto's bias curve: slope x / ((slope - 1) x + 1))
    anneal_slope: float = bounded(10.0, above=0)


class ProposalSampler(nn.Module, Updateable):
    """Samples [R * n_samples] for rays, coarse to fine through the proposal networks (see the module docstring)."""

    def __init__(self, cfg: ProposalConfig, radius: float, contraction: str, step_size: float, disparity_from: float) -> None:
        super().__init__()
        if not cfg.samples or len(cfg.samples) != len(cfg.resolutions):
            raise ConfigError(f"system.renderer.proposal.resolutions needs one resolution per proposal stage (samples "
                              f"{list(cfg.samples)}), got {list(cfg.resolutions)}: e.g. "
                              "system.renderer.proposal.samples=[256,96] system.renderer.proposal.resolutions=[128,256]")
        self.cfg, self.step_size, self.disparity_from = cfg, step_size, disparity_from
        self.nets = nn.ModuleList(ImplicitVolume({
            "radius": radius, "contraction": contraction, "hidden_dim": cfg.hidden_dim, "n_feature_dims": 0,
            "density_activation": "trunc_exp",
            "encoding": {"n_levels": cfg.n_levels, "n_features_per_level": 2, "log2_hashmap_size": cfg.log2_hashmap_size,
                         "base_resolution": 16,
                         "per_level_scale": (res / 16) ** (1 / max(cfg.n_levels - 1, 1)) if cfg.n_levels > 1 else 1.0},
        }) for res in cfg.resolutions)
        self.register_buffer("anneal", torch.ones(()), persistent=False)  # power of the proposal weights (1 after training)
        self._anneal_value = 1.0

    def update_step(self, epoch: int, global_step: int) -> None:
        c = self.cfg
        x = min(max(global_step / c.anneal_steps, 0.0), 1.0) if c.anneal_steps > 0 else 1.0
        value = c.anneal_slope * x / ((c.anneal_slope - 1) * x + 1)
        if value != self._anneal_value:  # a device-side fill: read by a captured step at replay
            self.anneal.fill_(value)
            self._anneal_value = value

    def _distances(self, s: Tensor, u_near: Tensor, span: Tensor) -> Tensor:
        """Distances of normalized step counts ``s`` [R, E] (0 at ``t_near``, 1 at ``t_far``)."""
        return step_distance(u_near[:, None] + s * span[:, None], self.step_size, self.disparity_from)

    def sample(self, rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, training: bool) -> dict[str, Any]:
        """Packed samples, ray-major with ``n_samples`` each ({"ray", "lo", "hi", "valid": None, "ray_ok": None}), and
        under "proposal" what ``losses`` needs; ``training``: jittered (stratified) draws, else fixed ones."""
        n_rays, device = rays_o.shape[0], rays_o.device
        t_far = torch.maximum(t_far, t_near)
        u_near = step_index(t_near, self.step_size, self.disparity_from)
        span = step_index(t_far, self.step_size, self.disparity_from) - u_near
        counts = list(self.cfg.samples) + [self.cfg.n_samples]
        edges = torch.linspace(0.0, 1.0, counts[0] + 1, device=device).expand(n_rays, -1)
        if training:  # one jitter a ray: interior edges anywhere between their neighbors' midpoints
            centers = 0.5 * (edges[:, 1:] + edges[:, :-1])
            lower, upper = torch.cat([edges[:, :1], centers], -1), torch.cat([centers, edges[:, -1:]], -1)
            edges = lower + (upper - lower) * torch.rand(n_rays, 1, device=device)
        histograms = []
        for net, n_next in zip(self.nets, counts[1:], strict=False):
            t = self._distances(edges, u_near, span)
            points = rays_o[:, None] + rays_d[:, None] * (0.5 * (t[:, 1:] + t[:, :-1]))[..., None]
            density = net.density(points.reshape(-1, 3)).reshape(n_rays, -1)
            weights = dense_weights(density * (t[:, 1:] - t[:, :-1]))
            histograms.append((edges, weights))
            with torch.no_grad():
                draw = weights.detach().clamp_min(0) ** self.anneal + self.cfg.histogram_padding
                edges = sample_pdf(edges, draw, n_next + 1, _uniform(n_rays, n_next + 1, training, device)).detach()
        t = self._distances(edges, u_near, span)
        lo = torch.maximum(t[:, :-1], t_near[:, None]).clamp_max(t_far[:, None])
        hi = torch.maximum(t[:, 1:], lo).clamp_max(t_far[:, None])
        k = self.cfg.n_samples
        ray = torch.arange(n_rays, device=device)[:, None].expand(n_rays, k).reshape(-1)
        return {"ray": ray, "lo": lo.reshape(-1), "hi": hi.reshape(-1), "valid": None, "ray_ok": None,
                "proposal": {"edges": edges, "histograms": histograms}}

    @staticmethod
    def losses(proposal: dict[str, Any], weights: Tensor) -> dict[str, Tensor]:
        """Per-ray "interlevel" and "distortion" [R] from ``sample``'s "proposal" and the field's weights [R * n_samples]."""
        edges = proposal["edges"]
        weights = weights.reshape(edges.shape[0], -1)
        interlevel = sum(interlevel_loss(edges.detach(), weights.detach(), e, w) for e, w in proposal["histograms"])
        return {"interlevel": interlevel, "distortion": distortion_loss(edges, weights)}


def _uniform(n_rays: int, n: int, training: bool, device: torch.device) -> Tensor:
    """Sorted CDF levels [R, n] to invert: evenly spaced with one jitter a ray while training, from 0 to 1 otherwise."""
    if not training:
        return torch.linspace(0.0, 1.0, n, device=device).expand(n_rays, n)
    return (torch.arange(n, device=device) + torch.rand(n_rays, 1, device=device)) / n


def dense_weights(sigma_delta: Tensor) -> Tensor:
    """Volume-rendering weights [R, K] of optical thicknesses ``sigma_delta`` [R, K] along each ray, front to back
    (each thickness used up to ``MAX_OPTICAL_THICKNESS``, as ``render_weights`` does)."""
    sigma_delta = sigma_delta.clamp(max=MAX_OPTICAL_THICKNESS)
    alpha = 1.0 - torch.exp(-sigma_delta)
    before = torch.cumsum(sigma_delta, dim=-1) - sigma_delta
    return torch.exp(-before) * alpha


def outer_weights(edges: Tensor, env_edges: Tensor, env_weights: Tensor) -> Tensor:
    """For each interval of ``edges`` [R, K + 1], the weight [R, K] of every interval of ``env_edges`` [R, M + 1]
    (weights ``env_weights`` [R, M]) that overlaps it: the most the histogram can put there (an interval ending where
    one of the histogram's ends overlaps only the bins up to that end)."""
    running = torch.cat([torch.zeros_like(env_weights[:, :1]), torch.cumsum(env_weights, dim=-1)], dim=-1)
    m = env_weights.shape[-1]
    first = (torch.searchsorted(env_edges[:, :-1].contiguous(), edges[:, :-1].contiguous(), right=True) - 1).clamp(0, m - 1)
    last = torch.searchsorted(env_edges[:, 1:].contiguous(), edges[:, 1:].contiguous()).clamp(0, m - 1)
    return running[:, 1:].gather(-1, last) - running[:, :-1].gather(-1, first)


def interlevel_loss(edges: Tensor, weights: Tensor, env_edges: Tensor, env_weights: Tensor, eps: float = 1e-7) -> Tensor:
    """Mip-NeRF 360's proposal loss [R]: the field's weight of each interval beyond what the proposal histogram holds
    over it, squared and divided by that weight (mean over the intervals); zero when the histogram bounds the weights."""
    excess = (weights - outer_weights(edges, env_edges, env_weights)).clamp_min(0.0)
    return (excess**2 / (weights + eps)).mean(-1)
