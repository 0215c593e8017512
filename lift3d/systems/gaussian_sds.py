"""Recipe ``gaussian-sds``: 3D Gaussians distilled from a 2D prior (GaussianDreamer / DreamGaussian class).

Gaussians start uniformly in a ball (or at the points of a user's point cloud / mesh file:
``system.gaussians.init=points|mesh`` with ``init_path``), are rendered by the splat rasterizer from a
batch of random views on a solid background, and follow the guidance's gradient (SDS, with the timestep
range annealed by the guidance's scheduled ``max_step_percent``). 3DGS densification grows and prunes
them on a short schedule. Exports the Gaussians (.ply / .splat) and a mesh of their density (.glb).

``density_at`` / ``albedo_at`` read the Gaussians as the exporter does (``lift3d.export.GaussianField``:
density, and color per ``export.gaussian_colors``), so a mesh stage can start from this run
(``gaussian-sds-texture``: DreamGaussian's second stage).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.config import ConfigError, bounded, choice, step_count
from lift3d.export import ExportSources, GaussianField, GaussianTensors, gaussian_color_fn, gaussian_sources
from lift3d.export.grid import ColorFn
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.formats.splat import rgb_from_sh_dc
from lift3d.registry import register
from lift3d.systems.densification import build_strategy
from lift3d.systems.replicas import ReplicatedGaussians
from lift3d.systems.stages import take_gaussians
from lift3d.systems.text_to_3d import TextTo3DConfig, TextTo3DSystem

log = logging.getLogger(__name__)
SDS_INITS = ("random", "auto", "points", "mesh", "ply")  # gaussians.init values a text-to-3D run can start from


@dataclass
class GaussianSDSConfig(TextTo3DConfig):
    gaussians_type: str = "gaussians"  # the Gaussian model part
    gaussians: dict = dataclasses.field(default_factory=lambda: {  # its config
        "sh_degree": 0, "init": "random", "init_radius": 0.5, "init_points": 5000, "init_color": [0.5, 0.5, 0.5]})
    renderer_type: str = "splat-rasterizer"  # the rasterizer part
    renderer: dict = dataclasses.field(default_factory=dict)  # its config
    densify_type: str = "densify-3dgs"  # the densification strategy part
    densify: dict = dataclasses.field(default_factory=dict)  # its config
    init_fit_radius: bool = True  # init points/mesh: center the user's shape and scale it into a ball of gaussians.init_radius
    scene_extent: float = bounded(1.0, above=0)  # object size for densification's clone/split and prune thresholds (world units)
    background_color: list = bounded([1.0, 1.0, 1.0], low=0, high=1, lengths=(3,))  # RGB the Gaussians are rendered over
    # per view: a random solid color instead (the background cannot explain the object)
    random_background_probability: float = bounded(0.0, low=0, high=1)
    # DDP debug: every N steps check that all ranks hold the same Gaussians (0: off)
    replica_check_every: int = step_count(0, kind="kept")
    # several GPUs: each holds a shard of the Gaussians instead of a copy (scenes bigger than one GPU; auto: when a copy
    # would not fit its GPU's memory; lift3d.systems.shards)
    shard_gaussians: str = choice("auto", "true", "false", fold_case=True)
    # torch intra-op threads on the CPU (0: torch's default; 1 avoids contention with tiny tensors)
    cpu_threads: int = bounded(0, low=0)


def fit_in_ball(points: Tensor, radius: float) -> Tensor:
    """Points [N, 3] moved so their bounding box is centered on the origin and scaled so the farthest
    lies at ``radius`` (a user's shape in any units starts where the cameras look)."""
    center = (points.amin(0) + points.amax(0)) / 2
    centered = points - center
    far = centered.norm(dim=-1).max().clamp_min(1e-12)
    return centered * (radius / far)


@register("gaussian-sds")
class GaussianSDSSystem(ReplicatedGaussians, TextTo3DSystem):
    """Gaussians distilled by SDS from random views, with 3DGS densification."""

    Config = GaussianSDSConfig
    density_opacity_scale = GaussianField.opacity_scale  # density_at is unitless: a voxel's opacity is 1 - exp(-density)

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.gaussians = self.build_part(c.gaussians_type, c.gaussians)
        if self.gaussians.cfg.init not in SDS_INITS:  # hull and sfm need photos, which text-to-3D has not
            raise ConfigError(f"system.gaussians.init must be one of {', '.join(SDS_INITS)} for gaussian-sds, got "
                              f"'{self.gaussians.cfg.init}': e.g. system.gaussians.init=random")
        self.renderer = self.build_part(c.renderer_type, c.renderer)
        self.densify = build_strategy(self, c.densify_type, c.densify)  # checkpointed through its checkpoint_state
        self._last_render: dict[str, Tensor] | None = None
        self._surface: tuple | None = None  # (parameter refs, their (address, version)s, density field, color function)

    # ----------------------------------------------------------------------------------- set-up
    def setup(self, stage: str) -> None:
        on_cpu = self._trainer is not None and self.trainer.strategy.root_device.type == "cpu"
        if self.cfg.cpu_threads > 0 and on_cpu:
            torch.set_num_threads(self.cfg.cpu_threads)
        resuming = self._trainer is not None and self.trainer.ckpt_path is not None
        if stage == "fit" and len(self.gaussians) == 0 and not resuming and not self.cfg.geometry_convert_from:
            self.initialize_gaussians()
        super().setup(stage)

    @torch.no_grad()
    def initialize_gaussians(self) -> None:
        """Gaussians in a ball of ``gaussians.init_radius`` (init: random) or from ``gaussians.init_path``."""
        from lift3d.gaussians import init

        c = self.gaussians.cfg
        generator = torch.Generator().manual_seed(self.init_seed())
        colors = None
        if c.init in ("random", "auto"):
            points = init.random_in_sphere(c.init_points, c.init_radius or 0.5, generator)
        elif c.init == "points":
            points, colors = init.read_point_cloud(c.init_path)
        elif c.init == "mesh":
            points, colors = init.sample_mesh(c.init_path, c.init_points, up_axis=c.init_up_axis)
        elif c.init == "ply":
            self.gaussians.load_gaussian_file(c.init_path)  # every attribute as trained: nothing to initialize
            return
        if c.init in ("points", "mesh") and self.cfg.init_fit_radius:
            points = fit_in_ball(points, c.init_radius or 0.5)
        self.gaussians.initialize(points, colors, generator)
        log.info("initialized %d Gaussians (%s)", len(self.gaussians), c.init)

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        """Continue from a previous Gaussian run: take its Gaussians."""
        if take_gaussians(self, previous) is None:
            super().convert_from(previous, previous_cfg)
        log.info("took %d Gaussians from the previous stage", len(self.gaussians))

    # ----------------------------------------------------------------------------------- training
    def backgrounds(self, n: int, generator_step: int | None = None) -> Tensor:
        """[n, 3] background colors: the configured one, or random for a fraction of views during training."""
        color = torch.tensor([float(v) for v in self.cfg.background_color], device=self.device).expand(n, 3)
        p = self.cfg.random_background_probability
        if generator_step is None or p <= 0:
            return color.contiguous()
        generator = torch.Generator().manual_seed(int(torch.initial_seed() % (2**31)) + 7919 * generator_step)
        pick = (torch.rand(n, 1, generator=generator) < p).to(self.device)
        random = torch.rand(n, 3, generator=generator).to(self.device)
        return torch.where(pick, random, color)

    def render_gaussians(self, cameras: Any, background: Tensor | None, **options: Any) -> dict[str, Tensor]:
        """The rasterizer's output for ``cameras`` (``background`` [B, 3] or None; ``options`` to the rasterizer)."""
        return self.renderer(self.gaussians, cameras, background, self.gaussians.active_sh_degree, **options)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        cameras = batch["cameras"]
        out = self.render_gaussians(cameras, self.backgrounds(len(cameras), self.true_global_step))
        self._last_render = out
        terms = self.distill(out["rgb"], batch)
        self.log_step("train/gaussians", float(len(self.gaussians)))
        return self.total_loss(terms)

    def on_after_backward(self) -> None:
        out, self._last_render = self._last_render, None
        self.sync_gradients()  # DDP: the mean over ranks, before densification reads or replaces the parameters
        optimizers = self._all_optimizers()
        self.densify.after_backward(out, self.gaussians, optimizers[0] if optimizers else None, self.true_global_step,
                                    self.cfg.scene_extent)

    # ----------------------------------------------------------------------------------- checkpoints
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.gaussians.resize_to_state_dict(checkpoint["state_dict"], prefix="gaussians.")

    # ----------------------------------------------------------------------------------- evaluation and export
    def render(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        self.gaussians.update_step(self.current_epoch if self._trainer is not None else 0, self.true_global_step)
        cameras = batch["cameras"]
        background = batch.get("background")
        if background is None:
            background = self.backgrounds(len(cameras))
        out = self.render_gaussians(cameras, background.to(self.device))
        return {"rgb": out["rgb"], "alpha": out["alpha"], "depth": out["depth"]}

    def gaussian_tensors(self) -> GaussianTensors:
        g = self.gaussians
        return GaussianTensors(g.means.detach(), g.scales.detach(), g.quats.detach(), g.opacities.detach(),
                               colors=rgb_from_sh_dc(g.sh0.detach()[:, 0]))

    def surface_queries(self) -> tuple[GaussianField, ColorFn]:
        """The Gaussians' density field (cut off at ``export.gaussian_cutoff_sigma``) and color function
        (``export.gaussian_colors``), built once and rebuilt when a parameter is replaced, moved or
        changed in place (optimizer steps, densification, loading)."""
        g = self.gaussians
        if len(g) == 0:
            raise ValueError("this gaussian-sds run has no Gaussians: there is no surface to query or mesh")
        params = (g.means, g.log_scales, g.quats, g.opacity_logits, g.sh0)
        key = tuple((t.data_ptr(), t._version) for t in params)
        cached = self._surface
        if cached is None or cached[1] != key or any(ref() is not t for ref, t in zip(cached[0], params)):
            field = GaussianField(self.gaussian_tensors(), self.cfg.export.gaussian_cutoff_sigma)
            colors = gaussian_color_fn(field, self.cfg.export, lambda cameras: self.render({"cameras": cameras}),
                                         g.means.device)
            self._surface = (tuple(weakref.ref(t) for t in params), key, field, colors)
        return self._surface[2], self._surface[3]

    @torch.no_grad()
    def density_at(self, points: Tensor) -> Tensor:
        """The Gaussians' density [N] at world points [N, 3] (sum of opacity-weighted kernels; what is meshed)."""
        return self.surface_queries()[0].density(points).to(points.device)

    @torch.no_grad()
    def albedo_at(self, points: Tensor) -> Tensor:
        """Color [N, 3] at world points [N, 3], as the exported mesh is colored (texture stages inherit it)."""
        return self.surface_queries()[1](points).to(points.device)

    def export_sources(self) -> ExportSources:
        return gaussian_sources(self.gaussian_tensors(), self.cfg.export,
                                write_3dgs_ply=lambda path, **kept: save_ply(path, self.gaussians, **kept),
                                gaussian_params=self.gaussians.parameters_dict,
                                render_fn=lambda cameras: self.render({"cameras": cameras}), device=self.device,
                                field=self.surface_queries()[0],
                                antialiased=self.renderer.cfg.rasterize_mode == "antialiased")
