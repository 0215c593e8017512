"""The volume renderer: rays -> samples -> field -> material -> front-to-back compositing over a background.

It renders ``Cameras`` batches (``forward``, [B, H, W, C] outputs) and ray batches (``render_rays``, [N, C]
outputs), in chunks of rays. The field, material and background are held by reference (the system owns them); the
renderer owns the occupancy grid and updates it from ``update_step``.

Samples come from one of the marching paths, each its own module: occupancy-grid marching (``march_grid``: PyTorch
ops or the Triton kernel) followed by a density-only early-termination pass (``early_stop``) or, on the CPU, by
marching in segments (``march_segments``); importance sampling (``march_importance``); proposal networks
(``proposal``). While training on CUDA the passes use fixed sample budgets (``budgets``), so a step has no host
sync; rays that overflow a budget are reported in ``ray_valid`` for the loss to skip.

Over an unbounded (contracted) field rays run from ``near_plane`` to ``far_plane`` instead of through the field's
box, the occupancy grid covers the contracted space, and steps are fixed up to ``disparity_from``, then evenly
spaced in inverse distance, so a ray reaches the far plane in twice as many steps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.cameras import Cameras
from lift3d.registry import register
from lift3d.render.volume.budgets import SampleBudgets
from lift3d.render.volume.compositing import accumulate, render_weights
from lift3d.render.volume.early_stop import EarlyStop, terminate
from lift3d.render.volume.march_grid import compact_candidates, grid_candidates, kernel_applies, kernel_candidates
from lift3d.render.volume.march_importance import importance_samples
from lift3d.render.volume.march_segments import keep_in_segments
from lift3d.render.volume.occupancy import OccupancyGrid
from lift3d.render.volume.proposal import ProposalSampler
from lift3d.render.volume.renderer_config import VolumeRendererConfig, check_config
from lift3d.render.volume.sampling import n_marching_steps, ray_box, step_index


class _Parts:
    """Field, material and background held by reference, so they are not registered twice as submodules."""

    def __init__(self, field: Any, material: Any, background: Any) -> None:
        self.field, self.material, self.background = field, material, background


@register("volume-renderer")
class VolumeRenderer(BaseModule):
    """Volume rendering of an implicit field with a material and a background."""

    Config = VolumeRendererConfig

    def __init__(self, cfg: Any, field: Any, material: Any, background: Any) -> None:
        super().__init__(cfg)
        c = self.cfg
        check_config(c)
        self.parts = _Parts(field, material, background)
        self.contraction = getattr(field, "contraction", "none")
        if self.contraction != "none" and c.disparity_from <= 0:
            raise ValueError(f"an unbounded field (contraction {self.contraction}) needs renderer.disparity_from > 0 (the "
                             "distance from the camera beyond which steps grow), so rays reach far_plane in a bounded "
                             "number of steps: e.g. the cameras' distance from the scene center plus the field's radius")
        self.occupancy = OccupancyGrid(c.occupancy, field.bbox, self.contraction)
        extent = (field.bbox[1] - field.bbox[0]).float()
        self.diagonal = float(extent.norm())
        self.step_size = self.diagonal / c.steps_per_diagonal
        if self.unbounded:  # every ray spans the same step counts, from the near to the far plane
            span = step_index(torch.tensor([c.near_plane, c.far_plane], dtype=torch.float64), self.step_size,
                              c.disparity_from)
            self.unbounded_steps = n_marching_steps(float(span[1] - span[0]), 1.0)
        self.proposal = None if c.sampler != "proposal" else ProposalSampler(
            c.proposal, float(field.bbox[1, 0] - field.bbox[0, 0]) / 2, self.contraction, self.step_size, c.disparity_from)
        self.budgets = SampleBudgets(c)

    @property
    def field(self) -> Any:
        return self.parts.field

    @property
    def unbounded(self) -> bool:
        return self.contraction != "none"

    @property
    def stop(self) -> EarlyStop:
        """Which samples early termination keeps (read from the config on each render)."""
        return EarlyStop(self.cfg.early_stop_eps, self.cfg.alpha_threshold)

    def update_step(self, epoch: int, global_step: int) -> None:
        if self.training and self.proposal is None and self.occupancy.should_update(global_step):
            self.occupancy.update(self.field.density, self.step_size, global_step)

    # ------------------------------------------------------------------------------ sample budgets and counts
    def budget_per_ray(self) -> dict[str, float]:
        """Samples a ray that each pass's budget allows (see ``SampleBudgets.budget_per_ray``)."""
        return self.budgets.budget_per_ray()

    @property
    def _per_ray(self) -> dict[str, float]:  # the recent samples per ray of each pass (tests and benchmarks read it)
        return self.budgets.per_ray

    @_per_ray.setter
    def _per_ray(self, value: dict[str, float]) -> None:
        self.budgets.per_ray = value

    @property
    def _sample_sums(self) -> tuple[list[str], Tensor] | None:
        return self.budgets.sample_sums

    def _budget(self, name: str, n_rays: int) -> int | None:
        """Slots of pass ``name`` for a chunk of ``n_rays`` rays; the full-field pass is the second when early
        termination has a density-only first pass."""
        return self.budgets.budget(name, n_rays, "second" if self.stop.active else "first")

    def graph_key(self, n_rays: int, device: torch.device) -> tuple | None:
        """What fixes the shapes of a training render of ``n_rays`` rays, for capturing the step as a CUDA graph:
        the sample budgets of every chunk; None where the render needs the host (no budgets yet, or exact
        compaction) and so cannot be captured."""
        if self.cfg.sampler != "occupancy":  # fixed samples a ray: static shapes
            return (self.cfg.sampler,)
        if not self.budgets.active(device, True):
            return None
        self.budgets.refresh()
        chunk = self._chunk_rays(n_rays, True, device)
        sizes = sorted({min(chunk, n_rays - start) for start in range(0, max(n_rays, 1), chunk)})
        names = ("first", "second") if self.stop.active else ("first",)
        budgets = tuple(self._budget(name, size) for name in names for size in sizes)
        return None if None in budgets else budgets

    def begin_graph_capture(self) -> None:
        """From here until ``end_graph_capture`` budgets stay fixed and sample counts are kept on the device."""
        self.budgets.begin_capture()

    def end_graph_capture(self) -> list[tuple[dict[str, Tensor], int]]:
        """Stop capturing; the captured step's counts are kept (and returned) for ``record_graph_counts``."""
        return self.budgets.end_capture()

    def record_graph_counts(self) -> None:
        """Record the sample counts a replayed step wrote (the tensors of the last ``end_graph_capture``)."""
        self.budgets.record_captured()

    def sample_counts(self) -> dict[str, float]:
        """Training rays and samples of each marching pass since ``reset_sample_counts`` ("first": density-only
        evaluations in occupied cells, "second": full-field samples kept by early termination, "over_budget": rays
        that lost samples to a full budget), for benchmarks that explain the renderer's cost; reading them waits
        for the device."""
        return self.budgets.sample_counts()

    def reset_sample_counts(self) -> None:
        """Start counting training samples afresh (see ``sample_counts``)."""
        self.budgets.reset_sample_counts()

    # ------------------------------------------------------------------------------ sampling
    def _ray_range(self, rays_o: Tensor, rays_d: Tensor) -> tuple[Tensor, Tensor]:
        """Where each ray is sampled: through the field's box, or from the near to the far plane (unbounded)."""
        if not self.unbounded:
            return ray_box(rays_o, rays_d, self.field.bbox, self.cfg.near_plane)
        n = rays_o.shape[0]
        return rays_o.new_full((n,), self.cfg.near_plane), rays_o.new_full((n,), self.cfg.far_plane)

    def _n_steps(self, t_near: Tensor, t_far: Tensor, static: bool) -> int:
        """Marching steps that cover every ray: from the box's diagonal or the planes (static shapes, no host
        sync), else from the longest chord of these rays."""
        if self.unbounded:
            return self.unbounded_steps
        # fixed steps of dt are the smallest: a chord never needs more than chord / dt of them
        chord = self.diagonal if static else (float((t_far - t_near).clamp_min(0).max()) if t_near.numel() else 0.0)
        return n_marching_steps(chord, self.step_size)

    def _fused_march(self, device: torch.device) -> bool:
        """Whether marching candidates come from the Triton kernel (``march_grid.kernel_applies``)."""
        return kernel_applies(self.cfg.fused_march, device, self.unbounded, self.occupancy, self.cfg.disparity_from)

    def _density_pass(self, points: Tensor) -> tuple[Tensor, Tensor | None]:
        """Density at ``points`` for early termination, with the field's encoding of them where it is reused."""
        if self.cfg.reuse_encoding == "auto" and hasattr(self.field, "density_and_encoding"):
            return self.field.density_and_encoding(points)
        return self.field.density(points), None

    def _march(self, rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, training: bool,
               fuse: bool = False) -> dict[str, Any]:
        """Occupancy-grid marching + density-only early termination -> packed samples (with ``fuse`` and segment
        marching, also the field's outputs at them: "field")."""
        c = self.cfg
        n_rays, device = rays_o.shape[0], rays_o.device
        use_budget = self.budgets.active(device, training)
        if training and c.randomized:
            jitter = 1.0 - torch.rand(n_rays, device=device)
        else:
            jitter = torch.full((n_rays,), 0.5, device=device)
        n_steps = self._n_steps(t_near, t_far, static=use_budget)
        first_budget = self._budget("first", n_rays) if use_budget else None
        if self._fused_march(device):
            mask, first, ray, lo, hi = kernel_candidates(rays_o, rays_d, t_near, t_far, jitter, self.step_size, n_steps,
                                                         self.occupancy, first_budget)
        else:
            lo, hi, mask = grid_candidates(rays_o, rays_d, t_near, t_far, jitter, self.step_size, n_steps,
                                           c.disparity_from, self.occupancy)
            if self.stop.active and not use_budget and 0 < c.march_segment < n_steps and device.type == "cpu":
                return self._march_segments(rays_o, rays_d, lo, hi, mask, training, fuse)
            first, ray, lo, hi = compact_candidates(mask, lo, hi, first_budget)
        samples, counts = terminate(rays_o, rays_d, first, ray, lo, hi, n_steps, self._density_pass, self.stop,
                                    self._budget("second", n_rays) if use_budget else None)
        if training:
            ray_ok = samples["ray_ok"]
            over_budget = (~ray_ok).sum() if ray_ok is not None else torch.zeros((), device=device)
            self.budgets.record({"first": mask.sum(), **counts, "over_budget": over_budget}, n_rays)
        return samples

    def _march_segments(self, rays_o: Tensor, rays_d: Tensor, lo: Tensor, hi: Tensor, mask: Tensor, training: bool,
                        fuse: bool) -> dict[str, Any]:
        """The CPU's early termination in segments (``march_segments``); with ``fuse`` the field's outputs too."""
        n_rays, n_steps = mask.shape
        device = rays_o.device
        fields: list[dict[str, Tensor]] | None = [] if fuse else None
        if fuse:
            def evaluate(points: Tensor) -> dict[str, Tensor]:
                return self._field(points, False, training)
        else:
            def evaluate(points: Tensor) -> dict[str, Tensor]:
                return {"density": self.field.density(points)}
        with torch.set_grad_enabled(fuse and torch.is_grad_enabled()):
            flat = keep_in_segments(rays_o, rays_d, lo, hi, mask, self.cfg.march_segment, self.stop, evaluate, fields)
        if training:
            self.budgets.record({"first": mask.sum(), "second": torch.full((), float(flat.numel()), device=device),
                                 "over_budget": torch.zeros((), device=device)}, n_rays)
        ray = torch.div(flat, n_steps, rounding_mode="floor")
        field_out = fields[0] if fields else None  # one dict, in the order of ``flat``
        return {"ray": ray, "lo": lo.reshape(-1)[flat], "hi": hi.reshape(-1)[flat], "valid": None, "ray_ok": None,
                "field": field_out}

    # ------------------------------------------------------------------------------ rendering
    def _render_chunk(self, rays_o: Tensor, rays_d: Tensor, background: Tensor, light_positions: Tensor | None,
                      shading: str | None, compute_normals: bool, material: Any = None) -> dict[str, Tensor]:
        training = self.training and torch.is_grad_enabled()
        n_rays = rays_o.shape[0]
        t_near, t_far = self._ray_range(rays_o, rays_d)
        material = self.parts.material if material is None else material
        need_normals = compute_normals or material.requires_normals
        random = training and self.cfg.randomized
        if self.cfg.sampler == "occupancy":
            fuse = not need_normals and self.cfg.fuse_field_pass == "auto"
            samples = self._march(rays_o, rays_d, t_near, t_far, training, fuse=fuse)
        elif self.proposal is not None:
            samples = self.proposal.sample(rays_o, rays_d, t_near, t_far, random)
        else:
            spacing = (self.step_size, self.cfg.disparity_from) if self.unbounded else None
            samples = importance_samples(rays_o, rays_d, t_near, t_far, self.cfg.n_samples, self.cfg.n_importance,
                                         self.field.density, self.occupancy, random, spacing)
        ray, lo, hi, valid = samples["ray"], samples["lo"], samples["hi"], samples["valid"]
        t_mid = 0.5 * (lo + hi)
        dirs = rays_d[ray]
        positions = rays_o[ray] + dirs * t_mid[:, None]
        out = samples.get("field") or self._field(positions, need_normals, training, samples.get("encoding"))
        sigma_delta = out["density"] * (hi - lo)
        if valid is not None:
            sigma_delta = torch.where(valid, sigma_delta, torch.zeros_like(sigma_delta))
        weights, _, _ = render_weights(sigma_delta, ray)
        normals = out.get("normal")
        lights = None if light_positions is None else light_positions[ray]
        colors = material(out["features"], dirs, normals, positions, lights, shading)
        # one per-ray sum over all channels: opacity, color, distance (and normal)
        per_sample = [weights[:, None], weights[:, None] * colors, (weights * t_mid)[:, None]]
        if normals is not None:
            per_sample.append(weights[:, None] * normals)
        sums = accumulate(torch.cat(per_sample, dim=-1), ray, n_rays).split([p.shape[-1] for p in per_sample], dim=-1)
        alpha, foreground = sums[0], sums[1]
        depth = sums[2] / alpha.clamp_min(1e-6)
        result = {
            "rgb": foreground + (1.0 - alpha) * background,
            "alpha": alpha,
            "depth": depth,
            "weights": weights,
            "ray_indices": ray,
            "sample_t": t_mid,
            "num_samples": torch.full((), float(ray.numel()), device=rays_o.device),  # no host-to-device copy
        }
        if normals is not None:
            result["normal"] = sums[3]
            result["sample_normals"] = normals
            result["sample_directions"] = dirs
        if samples["ray_ok"] is not None:
            result["ray_valid"] = samples["ray_ok"]
        if "proposal" in samples and training:  # per-ray interlevel and distortion losses
            result.update(self.proposal.losses(samples["proposal"], weights))
        return result

    def _field(self, positions: Tensor, with_normal: bool, training: bool, encoding: Tensor | None = None) -> dict[str, Tensor]:
        """The field at sample positions (reusing the density pass's ``encoding`` of them, if kept); in pieces when
        not training, to bound memory (normals take 7 lookups)."""
        chunk = self.cfg.eval_field_chunk
        if chunk < 0:
            chunk = 262144 if positions.device.type == "cuda" else 16384
        if training or positions.shape[0] <= chunk:
            return self._field_at(positions, with_normal, encoding)
        encodings = [None] * math.ceil(positions.shape[0] / chunk) if encoding is None else encoding.split(chunk)
        pieces = [self._field_at(p, with_normal, e) for p, e in zip(positions.split(chunk), encodings, strict=True)]
        return {key: torch.cat([piece[key] for piece in pieces]) for key in pieces[0]}

    def _field_at(self, positions: Tensor, with_normal: bool, encoding: Tensor | None) -> dict[str, Tensor]:
        if encoding is None:
            return self.field(positions, with_normal=with_normal)
        return self.field(positions, with_normal=with_normal, encoding=encoding)

    def _chunk_rays(self, n_rays: int, training: bool, device: torch.device) -> int:
        """Rays rendered together: the configured chunk (-1: by device, 0: all ``n_rays`` at once)."""
        chunk = self.cfg.train_chunk_rays if training else self.cfg.eval_chunk_rays
        if chunk < 0 and training:
            chunk = 262144 if device.type == "cuda" else 32768
        elif chunk < 0:
            chunk = 65536 if device.type == "cuda" else 16384
        return max(n_rays, 1) if chunk == 0 else chunk

    def render_rays(self, rays_o: Tensor, rays_d: Tensor, background: Tensor | None = None,
                    light_positions: Tensor | None = None, shading: str | None = None,
                    compute_normals: bool = False, material: Any = None) -> dict[str, Tensor]:
        """Render rays [N, 3] (unit directions) -> {"rgb", "alpha", "depth" (distance along the ray), ...} [N, C].

        ``background`` [N, C] (default: the background part on the ray directions); ``light_positions`` [N, 3];
        ``material`` replaces the configured material for this call (e.g. one giving C = 4 latent channels)."""
        if rays_o.ndim != 2 or rays_o.shape[-1] != 3 or rays_d.shape != rays_o.shape:
            raise ValueError(f"rays_o and rays_d must both be [N, 3], got {tuple(rays_o.shape)} and {tuple(rays_d.shape)}")
        if background is None:
            background = self.parts.background(rays_d[None])[0]
        training = self.training and torch.is_grad_enabled()
        if training and not self.budgets.capturing:
            self.budgets.refresh()
        chunk = self._chunk_rays(rays_o.shape[0], training, rays_o.device)
        pieces = []
        for start in range(0, max(rays_o.shape[0], 1), chunk):
            end = start + chunk
            lights = None if light_positions is None else light_positions[start:end]
            pieces.append(self._render_chunk(rays_o[start:end], rays_d[start:end], background[start:end], lights,
                                             shading, compute_normals, material))
        return _join_chunks(pieces, chunk)

    def forward(self, cameras: Cameras, background: Tensor | None = None, light_positions: Tensor | None = None,
                shading: str | None = None, compute_normals: bool = False, material: Any = None) -> dict[str, Tensor]:
        """Render every pixel of ``cameras`` -> {"rgb", "alpha", "depth" (camera z), "normal"?, ...} [B, H, W, C].

        ``background``: [B, C] or [B, H, W, C] (default: the background part); ``light_positions`` [B, 3];
        ``material`` replaces the configured material for this call."""
        b, h, w = len(cameras), cameras.height, cameras.width
        rays_o, rays_d = cameras.rays()
        if background is None:
            background = self.parts.background(rays_d)
        elif background.ndim == 2:
            background = background[:, None, None, :].expand(b, h, w, background.shape[-1])
        lights = None
        if light_positions is not None:
            lights = light_positions[:, None, :].expand(b, h * w, 3).reshape(-1, 3)
        flat_background = background.reshape(-1, background.shape[-1]).to(rays_o)
        out = self.render_rays(rays_o.reshape(-1, 3), rays_d.reshape(-1, 3), flat_background, lights, shading,
                               compute_normals, material)
        forward_axis = -cameras.c2w[:, :3, 2]
        cosine = (rays_d * forward_axis[:, None, None, :]).sum(-1, keepdim=True)  # [B, H, W, 1]
        images = {}
        for key, value in out.items():
            if value.ndim >= 1 and value.shape[0] == b * h * w and key in PER_RAY_KEYS:
                images[key] = value.reshape(b, h, w, -1)
            else:
                images[key] = value
        images["depth"] = images["depth"] * cosine
        images["background"] = background
        return images


PER_RAY_KEYS = ("rgb", "alpha", "depth", "normal", "ray_valid")


def _join_chunks(pieces: list[dict[str, Tensor]], chunk: int) -> dict[str, Tensor]:
    if len(pieces) == 1:
        return pieces[0]
    joined: dict[str, Tensor] = {}
    for key in pieces[0]:
        values = [p[key] for p in pieces]
        if key == "ray_indices":
            values = [v + i * chunk for i, v in enumerate(values)]
        joined[key] = torch.stack(values).sum() if key == "num_samples" else torch.cat(values)
    return joined

