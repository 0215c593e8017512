"""The volume renderer: rays -> samples (occupancy-grid marching or importance sampling) -> field ->
material -> front-to-back compositing over a background.

It renders ``Cameras`` batches (``forward``, [B, H, W, C] outputs) and ray batches (``render_rays``,
[N, C] outputs), in chunks of rays. The field, material and background are held by reference (the
system owns them); the renderer owns the occupancy grid and updates it from ``update_step``.

Sampling with the occupancy grid runs in two passes: density only (no gradient) on every step in an
occupied cell, then the full field with gradients on the steps whose transmittance is still above
``early_stop_eps`` (early ray termination); on the CPU, marching in segments, the first pass evaluates the
whole field and keeps its outputs at the kept samples instead (``fuse_field_pass``). While training on
CUDA both passes use fixed sample budgets sized from the counts of earlier steps (read back
asynchronously), so a step has no host sync; rays that overflow a budget are reported in ``ray_valid``
for the loss to skip.

Over an unbounded (contracted) field rays run from ``near_plane`` to ``far_plane`` instead of through the
field's box, the occupancy grid covers the contracted space, and steps are fixed up to ``disparity_from``,
then evenly spaced in inverse distance, so a ray reaches the far plane in twice as many steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.cameras import Cameras
from lift3d.config_checks import check_minimums
from lift3d.registry import register
from lift3d.render.volume.compositing import accumulate, render_weights
from lift3d.render.volume.occupancy import OccupancyGrid, OccupancyGridConfig
from lift3d.render.volume.proposal import ProposalConfig, ProposalSampler
from lift3d.render.volume.sampling import (
    Packed,
    compact,
    intervals_from_points,
    n_marching_steps,
    ray_box,
    sample_pdf,
    step_bounds,
    step_distance,
    step_index,
    stratified_samples,
)


@dataclass
class VolumeRendererConfig:
    """How rays are sampled and composited."""

    sampler: str = "occupancy"  # occupancy (Instant-NGP marching with empty-space skipping), importance (NeRF-style) or proposal (nerfacto)
    proposal: ProposalConfig = field(default_factory=ProposalConfig)  # sampler proposal: networks and samples (lift3d.render.volume.proposal)
    steps_per_diagonal: int = 1024  # occupancy: marching step = box diagonal / this
    occupancy: OccupancyGridConfig = field(default_factory=OccupancyGridConfig)  # the grid (also masks importance samples)
    early_stop_eps: float = 1e-4  # occupancy: drop samples once transmittance falls below this (0: keep all)
    alpha_threshold: float = 0.0  # occupancy: drop samples with opacity below this (0: keep all)
    n_samples: int = 64  # importance: stratified samples per ray
    n_importance: int = 64  # importance: extra samples per ray drawn from the stratified weights
    near_plane: float = 0.0  # no sample closer to the ray origin than this
    far_plane: float = 1000.0  # unbounded (contracted) fields: no sample farther than this, scene units
    disparity_from: float = 0.0  # unbounded fields: fixed steps up to this distance, then evenly spaced in 1/distance (Mip-NeRF 360)
    randomized: bool = True  # jitter samples while training (stratified sampling)
    train_chunk_rays: int = -1  # rays per chunk while training (bounds the marching candidates' memory; -1: 262144 on CUDA, 32768 on CPU; 0: one chunk). Every chunk's sample budget is sized for the densest chunk seen, so on CUDA a render takes few, large chunks: 4 views of 256x256 in 8 chunks ran on budgets twice their samples
    eval_chunk_rays: int = -1  # rays per chunk when not training (-1: 65536 on CUDA, 16384 on CPU)
    eval_field_chunk: int = -1  # samples per field call when not training (-1: 262144 on CUDA, 16384 on CPU)
    sample_budget: str = "auto"  # auto (fixed budgets while training on CUDA: no host sync), always, never (exact)
    budget_margin: float = 1.25  # budgets are this times the sample counts seen recently
    max_train_samples: int = 0  # with budgets: at most this many full-field samples a chunk of training rays; the rays past it are left out of the loss (Instant-NGP's fixed sample batch: early, foggy steps cost no more than later ones; 0: no limit)
    march_segment: int = 32  # on the CPU without budgets: density-only pass this many steps at a time, skipping rays already opaque (0: one pass; CUDA: one pass, as each segment waits for the GPU twice)
    fuse_field_pass: str = "auto"  # with march_segment (CPU only): the segment pass evaluates the whole field and keeps its outputs, no second pass (auto: do so; never: density-only segments, then a second pass)
    reuse_encoding: str = "auto"  # auto: the density-only pass keeps the field's encoding (hash-grid features) of the samples it keeps, and the full pass reuses it instead of looking it up again (the same values and gradients); never: look up twice
    fused_march: str = "auto"  # auto: on CUDA, bounded fields' marching candidates (step, box, occupied cell) come from one Triton kernel (march_triton), the PyTorch ops' mask but for the rare midpoint on a cell face; never: the PyTorch ops


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
        self.parts = _Parts(field, material, background)
        self.contraction = getattr(field, "contraction", "none")
        if self.contraction != "none" and c.disparity_from <= 0:
            raise ValueError(f"an unbounded field (contraction {self.contraction}) needs renderer.disparity_from > 0 (the "
                             "distance from the camera beyond which steps grow), so rays reach far_plane in a bounded number "
                             "of steps: e.g. the cameras' distance from the scene centre plus the field's radius")
        self.occupancy = OccupancyGrid(c.occupancy, field.bbox, self.contraction)
        extent = (field.bbox[1] - field.bbox[0]).float()
        self.diagonal = float(extent.norm())
        self.step_size = self.diagonal / c.steps_per_diagonal
        if self.unbounded:  # every ray spans the same step counts, from the near to the far plane
            span = step_index(torch.tensor([c.near_plane, c.far_plane], dtype=torch.float64), self.step_size, c.disparity_from)
            self.unbounded_steps = n_marching_steps(float(span[1] - span[0]), 1.0)
        self.proposal = None if c.sampler != "proposal" else ProposalSampler(
            c.proposal, float(field.bbox[1, 0] - field.bbox[0, 0]) / 2, self.contraction, self.step_size, c.disparity_from)
        self._per_ray: dict[str, float] = {}  # recent samples per ray of each pass, sizes the budgets
        self._readback: tuple[Tensor, Any] | None = None
        self._pending = False
        self._pending_names: list[str] = []
        self._sample_sums: tuple[list[str], Tensor] | None = None  # training samples of each pass since the last reset
        self._sample_rays = 0
        self._graph_counts: list[tuple[dict[str, Tensor], int]] | None = None  # counts of a step being captured
        self._replay_counts: list[tuple[dict[str, Tensor], int]] = []  # those of the last capture, rewritten by each replay

    @property
    def field(self) -> Any:
        return self.parts.field

    def update_step(self, epoch: int, global_step: int) -> None:
        if self.training and self.proposal is None and self.occupancy.should_update(global_step):
            self.occupancy.update(self.field.density, self.step_size, global_step)

    # ------------------------------------------------------------------------------ sample budgets
    def _use_budget(self, device: torch.device, training: bool) -> bool:
        mode = self.cfg.sample_budget
        return training and (mode == "always" or (mode == "auto" and device.type == "cuda"))

    def budget_per_ray(self) -> dict[str, float]:
        """Samples a ray that each pass's budget allows: ``budget_margin`` times the most a ray of any chunk needed
        lately (a chunk's budget is this times its rays, rounded up to 4096, capped by ``max_train_samples``)."""
        return {name: per_ray * self.cfg.budget_margin for name, per_ray in self._per_ray.items()}

    def _budget(self, name: str, n_rays: int) -> int | None:
        per_ray = self.budget_per_ray().get(name)
        if per_ray is None:
            return None
        budget = max(4096, math.ceil(per_ray * n_rays / 4096) * 4096)
        full_field_pass = "second" if self._stopping else "first"
        if name == full_field_pass and self.cfg.max_train_samples > 0:
            budget = min(budget, self.cfg.max_train_samples)
        return budget

    @property
    def _stopping(self) -> bool:
        """Whether marching has a density-only first pass and early termination (else every candidate is kept)."""
        return self.cfg.early_stop_eps > 0 or self.cfg.alpha_threshold > 0

    def _observe(self, name: str, per_ray: float) -> None:
        if name not in ("first", "second"):  # the passes that have budgets
            return
        old = self._per_ray.get(name)
        if old is None or per_ray > old or per_ray * self.cfg.budget_margin < old:
            self._per_ray[name] = per_ray

    def _record_counts(self, counts: dict[str, Tensor], n_rays: int) -> None:
        """Remember samples per ray: synchronously on CPU, through a pinned buffer and an event on CUDA (while a
        step is captured, kept for ``record_graph_counts``: a graph cannot copy to the host)."""
        if self._graph_counts is not None:
            self._graph_counts.append((counts, n_rays))
            return
        names = sorted(counts)
        raw = torch.stack([counts[k].float() for k in names])
        if self._sample_sums is None or self._sample_sums[0] != names or self._sample_sums[1].device != raw.device:
            self._sample_sums = (names, torch.zeros_like(raw))
        self._sample_sums[1].add_(raw)  # on the device: counting costs no host sync
        self._sample_rays += n_rays
        values = raw / max(n_rays, 1)
        if values.device.type != "cuda":
            for name, value in zip(names, values.tolist()):
                self._observe(name, value)
            return
        if self._readback is None or self._readback[0].numel() != len(names):
            self._readback = (torch.zeros(len(names), pin_memory=True), torch.cuda.Event())
        host, event = self._readback
        host.copy_(values, non_blocking=True)
        event.record()
        self._pending_names = names
        self._pending = True

    def _refresh_budgets(self) -> None:
        if self._pending and self._readback is not None and self._readback[1].query():
            for name, value in zip(self._pending_names, self._readback[0].tolist()):
                self._observe(name, value)
            self._pending = False

    # ------------------------------------------------------------------------------ captured training steps
    def graph_key(self, n_rays: int, device: torch.device) -> tuple | None:
        """What fixes the shapes of a training render of ``n_rays`` rays, for capturing the step as a CUDA graph:
        the sample budgets of every chunk; None where the render needs the host (no budgets yet, or exact
        compaction) and so cannot be captured."""
        if self.cfg.sampler != "occupancy":  # fixed samples a ray: static shapes
            return (self.cfg.sampler,)
        if not self._use_budget(device, True):
            return None
        self._refresh_budgets()
        chunk = self._chunk_rays(n_rays, True, device)
        sizes = sorted({min(chunk, n_rays - start) for start in range(0, max(n_rays, 1), chunk)})
        names = ("first", "second") if self._stopping else ("first",)
        budgets = tuple(self._budget(name, size) for name in names for size in sizes)
        return None if None in budgets else budgets

    def begin_graph_capture(self) -> None:
        """From here until ``end_graph_capture`` budgets stay fixed and sample counts are kept on the device."""
        self._graph_counts = []

    def end_graph_capture(self) -> list[tuple[dict[str, Tensor], int]]:
        """Stop capturing; the captured step's counts are kept (and returned) for ``record_graph_counts``."""
        self._replay_counts, self._graph_counts = self._graph_counts or [], None
        return self._replay_counts

    def record_graph_counts(self) -> None:
        """Record the sample counts a replayed step wrote (the tensors of the last ``end_graph_capture``)."""
        for values, n_rays in self._replay_counts:
            self._record_counts(values, n_rays)

    def sample_counts(self) -> dict[str, float]:
        """Training rays and samples of each marching pass since ``reset_sample_counts`` ("first": density-only
        evaluations in occupied cells, "second": full-field samples kept by early termination, "over_budget": rays
        that lost samples to a full budget), for benchmarks that explain the renderer's cost; reading them waits
        for the device."""
        counts = {"rays": float(self._sample_rays)}
        if self._sample_sums is not None:
            counts.update(zip(self._sample_sums[0], self._sample_sums[1].tolist()))
        return counts

    def reset_sample_counts(self) -> None:
        """Start counting training samples afresh (see ``sample_counts``)."""
        self._sample_sums, self._sample_rays = None, 0

    # ------------------------------------------------------------------------------ sampling
    @property
    def unbounded(self) -> bool:
        return self.contraction != "none"

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

    def _march(self, rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, training: bool,
               fuse: bool = False) -> dict[str, Any]:
        """Occupancy-grid marching + density-only early termination -> packed samples (with ``fuse`` and segment
        marching, also the field's outputs at them: "field")."""
        n_rays, device = rays_o.shape[0], rays_o.device
        use_budget = self._use_budget(device, training)
        jitter = (1.0 - torch.rand(n_rays, device=device)) if training and self.cfg.randomized else torch.full((n_rays,), 0.5, device=device)
        n_steps = self._n_steps(t_near, t_far, static=use_budget)
        if self._fused_march(device):
            return self._march_fused(rays_o, rays_d, t_near, t_far, jitter, n_steps, training, use_budget)
        k = torch.arange(n_steps, device=device, dtype=rays_o.dtype)
        lo, hi = step_bounds(t_near[:, None], t_far[:, None], jitter[:, None], self.step_size, k[None, :],
                             self.cfg.disparity_from)
        mask = hi > lo
        if self.occupancy.cfg.enabled:
            mid = 0.5 * (lo + hi)
            points = rays_o[:, None, :] + rays_d[:, None, :] * mid[..., None]
            mask = mask & self.occupancy.query(points.reshape(-1, 3)).reshape(n_rays, n_steps)
        stopping = self._stopping
        if stopping and not use_budget and 0 < self.cfg.march_segment < n_steps and device.type == "cpu":
            fields: list[dict[str, Tensor]] | None = [] if fuse else None
            with torch.set_grad_enabled(fuse and torch.is_grad_enabled()):
                flat = self._keep_in_segments(rays_o, rays_d, lo, hi, mask, fields, training)
            if training:
                self._record_counts({"first": mask.sum(), "second": torch.full((), float(flat.numel()), device=device),
                                     "over_budget": torch.zeros((), device=device)}, n_rays)
            ray = torch.div(flat, n_steps, rounding_mode="floor")
            field_out = fields[0] if fields else None  # one dict, in the order of ``flat``
            return {"ray": ray, "lo": lo.reshape(-1)[flat], "hi": hi.reshape(-1)[flat], "valid": None, "ray_ok": None,
                    "field": field_out}
        first = compact(mask.reshape(-1), self._budget("first", n_rays) if use_budget else None)
        ray = torch.div(first.index, n_steps, rounding_mode="floor")
        lo, hi = lo.reshape(-1)[first.index], hi.reshape(-1)[first.index]
        return self._terminate(rays_o, rays_d, mask, first, ray, lo, hi, n_steps, training, use_budget)

    def _fused_march(self, device: torch.device) -> bool:
        """Whether marching candidates come from the Triton kernel: CUDA, occupancy grid, bounded field."""
        if self.cfg.fused_march == "never" or device.type != "cuda" or self.unbounded:
            return False
        if not self.occupancy.cfg.enabled or self.cfg.disparity_from > 0:
            return False
        from lift3d.render.volume import march_triton

        return march_triton.available(device)

    def _march_fused(self, rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, jitter: Tensor, n_steps: int,
                     training: bool, use_budget: bool) -> dict[str, Any]:
        """``_march`` with the candidates' mask from one kernel; intervals only for the candidates kept."""
        from lift3d.render.volume import march_triton

        occupancy = self.occupancy
        mask = march_triton.occupied_steps(rays_o, rays_d, t_near, t_far, jitter, self.step_size, n_steps,
                                           occupancy.occupied, occupancy.bbox, occupancy.resolution)
        n_rays = rays_o.shape[0]
        first = compact(mask.reshape(-1), self._budget("first", n_rays) if use_budget else None)
        ray = torch.div(first.index, n_steps, rounding_mode="floor")
        k = (first.index - ray * n_steps).to(rays_o.dtype)
        lo, hi = step_bounds(t_near[ray], t_far[ray], jitter[ray], self.step_size, k)
        return self._terminate(rays_o, rays_d, mask, first, ray, lo, hi, n_steps, training, use_budget)

    def _terminate(self, rays_o: Tensor, rays_d: Tensor, mask: Tensor, first: Packed, ray: Tensor, lo: Tensor, hi: Tensor,
                   n_steps: int, training: bool, use_budget: bool) -> dict[str, Any]:
        """Compacted candidates -> the samples early termination keeps (density-only pass), as packed arrays."""
        n_rays = rays_o.shape[0]
        valid = first.valid
        ray_ok = None if first.dropped is None else ~first.dropped.reshape(n_rays, n_steps).any(dim=1)
        counts = {"first": mask.sum()}
        encoding = None
        if self._stopping:
            with torch.no_grad():
                points = rays_o[ray] + rays_d[ray] * (0.5 * (lo + hi))[:, None]
                if self._reuses_encoding():
                    density, encoding = self.field.density_and_encoding(points)
                else:
                    density = self.field.density(points)
                sigma_delta = density * (hi - lo)
                if valid is not None:
                    sigma_delta = torch.where(valid, sigma_delta, torch.zeros_like(sigma_delta))
                _, transmittance, alpha = render_weights(sigma_delta, ray)
                keep = self._kept(transmittance, alpha, lo, hi)
                if valid is not None:
                    keep = keep & valid
                counts["second"] = keep.sum()
                second = compact(keep, self._budget("second", n_rays) if use_budget else None)
            if second.dropped is not None:
                lost = accumulate(second.dropped.float(), ray, n_rays) > 0
                ray_ok = ~lost if ray_ok is None else ray_ok & ~lost
            ray, lo, hi, valid = ray[second.index], lo[second.index], hi[second.index], second.valid
            if encoding is not None:
                from lift3d.render.volume.pack_triton import take_rows

                encoding = take_rows(encoding, second.index)
        if training:
            counts["over_budget"] = (~ray_ok).sum() if ray_ok is not None else torch.zeros((), device=rays_o.device)
            self._record_counts(counts, n_rays)
        return {"ray": ray, "lo": lo, "hi": hi, "valid": valid, "ray_ok": ray_ok, "encoding": encoding}

    def _reuses_encoding(self) -> bool:
        """Whether the density-only pass keeps the field's encoding for the full pass (fields that offer it)."""
        return self.cfg.reuse_encoding == "auto" and hasattr(self.field, "density_and_encoding")

    def _kept(self, transmittance: Tensor, alpha: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
        """Which samples early termination keeps: transmittance still above ``early_stop_eps``, opacity at least
        ``alpha_threshold``, a non-empty interval."""
        return (transmittance >= self.cfg.early_stop_eps) & (alpha >= self.cfg.alpha_threshold) & (hi > lo)

    def _keep_in_segments(self, rays_o: Tensor, rays_d: Tensor, lo: Tensor, hi: Tensor, mask: Tensor,
                          fields: list[dict[str, Tensor]] | None = None, training: bool = False) -> Tensor:
        """Flat indices [S] into the candidates ``mask`` [R, K] (ray-major, in step order) that early termination
        keeps: densities are evaluated ``march_segment`` steps at a time and only on rays whose transmittance is
        still above ``early_stop_eps``, so nothing behind an opaque surface is evaluated. The same samples as one
        pass over every candidate: a sample's transmittance depends only on the samples before it.

        With ``fields`` (a list), the whole field is evaluated instead of its density (with gradients when they
        are enabled) and the outputs at the kept samples, in the order of the returned indices, are appended to
        it: the renderer then needs no second field pass (on a CPU that pass cost as much as this one)."""
        n_rays, n_steps = mask.shape
        eps = self.cfg.early_stop_eps
        limit = -math.log(eps) if eps > 0 else math.inf  # optical depth at which transmittance falls below eps
        depth = torch.zeros(n_rays, device=mask.device)  # optical depth gathered by each ray so far
        kept = []
        for start in range(0, n_steps, self.cfg.march_segment):
            alive = depth < limit
            if not alive.any():
                break
            block = mask[:, start:start + self.cfg.march_segment] & alive[:, None]
            width = block.shape[1]
            index = torch.nonzero(block.reshape(-1)).reshape(-1)
            ray, step = torch.div(index, width, rounding_mode="floor"), start + index % width
            lo_s, hi_s = lo[ray, step], hi[ray, step]
            points = rays_o[ray] + rays_d[ray] * (0.5 * (lo_s + hi_s))[:, None]
            if fields is None:
                density = self.field.density(points)
            else:
                out = self._field(points, False, training)
                density = out["density"].detach()
            sigma_delta = density * (hi_s - lo_s)
            _, transmittance, alpha = render_weights(sigma_delta, ray)
            keep = self._kept(transmittance * torch.exp(-depth[ray]), alpha, lo_s, hi_s)
            kept.append((ray * n_steps + step)[keep])
            if fields is not None:
                fields.append({key: value[keep] for key, value in out.items()})
            depth = depth + accumulate(sigma_delta.to(depth.dtype), ray, n_rays)
        if not kept:
            return torch.zeros(0, dtype=torch.long, device=mask.device)
        flat, order = torch.sort(torch.cat(kept))
        if fields:
            joined = {key: torch.cat([f[key] for f in fields])[order] for key in fields[0]}
            fields[:] = [joined]
        return flat

    def _importance(self, rays_o: Tensor, rays_d: Tensor, t_near: Tensor, t_far: Tensor, training: bool) -> dict[str, Any]:
        """Stratified samples + inverse-CDF samples from their (no-gradient) weights -> packed samples."""
        n_rays, device = rays_o.shape[0], rays_o.device
        n, m = self.cfg.n_samples, self.cfg.n_importance
        random = training and self.cfg.randomized
        t_far = torch.maximum(t_far, t_near)
        jitter = torch.rand(n_rays, n, device=device) if random else None
        if self.unbounded:  # evenly in step counts: denser near the camera, sparser towards the far plane
            step, knee = self.step_size, self.cfg.disparity_from
            u = stratified_samples(step_index(t_near, step, knee), step_index(t_far, step, knee), n, jitter)
            t = step_distance(u, step, knee)
        else:
            t = stratified_samples(t_near, t_far, n, jitter)
        ray = torch.arange(n_rays, device=device)
        if m > 0:
            with torch.no_grad():
                lo, hi = intervals_from_points(t, t_near, t_far)
                points = rays_o[:, None] + rays_d[:, None] * t[..., None]
                sigma = self.field.density(points.reshape(-1, 3))
                if self.occupancy.cfg.enabled:
                    sigma = torch.where(self.occupancy.query(points.reshape(-1, 3)), sigma, torch.zeros_like(sigma))
                weights, _, _ = render_weights(sigma * (hi - lo).reshape(-1), ray.repeat_interleave(n))
                edges = torch.cat([lo, hi[:, -1:]], dim=-1)
                uniform = torch.rand(n_rays, m, device=device) if random else None
                extra = sample_pdf(edges, weights.reshape(n_rays, n), m, uniform)
            t = torch.sort(torch.cat([t, extra.detach()], dim=-1), dim=-1).values
        lo, hi = intervals_from_points(t, t_near, t_far)
        k = t.shape[1]
        ray = ray[:, None].expand(n_rays, k).reshape(-1)
        valid = None
        if self.occupancy.cfg.enabled:
            points = rays_o[:, None] + rays_d[:, None] * (0.5 * (lo + hi))[..., None]
            valid = self.occupancy.query(points.reshape(-1, 3))
        return {"ray": ray, "lo": lo.reshape(-1), "hi": hi.reshape(-1), "valid": valid, "ray_ok": None}

    # ------------------------------------------------------------------------------ rendering
    def _render_chunk(self, rays_o: Tensor, rays_d: Tensor, background: Tensor, light_positions: Tensor | None,
                      shading: str | None, compute_normals: bool, material: Any = None) -> dict[str, Tensor]:
        training = self.training and torch.is_grad_enabled()
        n_rays = rays_o.shape[0]
        t_near, t_far = self._ray_range(rays_o, rays_d)
        material = self.parts.material if material is None else material
        need_normals = compute_normals or material.requires_normals
        if self.cfg.sampler == "occupancy":
            samples = self._march(rays_o, rays_d, t_near, t_far, training, fuse=not need_normals and self.cfg.fuse_field_pass == "auto")
        elif self.proposal is not None:
            samples = self.proposal.sample(rays_o, rays_d, t_near, t_far, training and self.cfg.randomized)
        else:
            samples = self._importance(rays_o, rays_d, t_near, t_far, training)
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
        # one per-ray sum over all channels: opacity, colour, distance (and normal)
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
        pieces = [self._field_at(p, with_normal, e) for p, e in zip(positions.split(chunk), encodings)]
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
        if training and self._graph_counts is None:
            self._refresh_budgets()
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
        out = self.render_rays(rays_o.reshape(-1, 3), rays_d.reshape(-1, 3), background.reshape(-1, background.shape[-1]).to(rays_o),
                               lights, shading, compute_normals, material)
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

