"""Recipe ``reconstruct-gaussians``: 3D Gaussian Splatting from posed photos (Kerbl et al. 2023).

Loss (1 - lambda) L1 + lambda D-SSIM with lambda = 0.2, per-parameter Adam learning rates with the
position rate decaying log-linearly and scaled by the scene extent, 3DGS densification, progressive
SH degree. Writes the Gaussians as a 3DGS .ply into ``save/`` when training ends.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.config import bounded, choice, scheduled, step_count
from lift3d.data.summary import SceneSummary
from lift3d.export import ExportConfig, ExportSources, GaussianTensors, gaussian_sources
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.formats.splat import rgb_from_sh_dc
from lift3d.gaussians.resolution_schedule import check_schedule
from lift3d.metrics import masked_prediction, ssim
from lift3d.registry import register
from lift3d.render.appearance import AppearanceConfig, PhotoAppearance
from lift3d.render.pose_refinement import PoseCorrections, PoseRefinementConfig
from lift3d.schedule import is_schedule
from lift3d.systems.appearance import AppearanceHooks
from lift3d.systems.base import BaseSystem, LossConfig, SystemConfig
from lift3d.systems.captured_views import CapturedViews
from lift3d.systems.densification import build_strategy
from lift3d.systems.graphed_splats import GraphedSplatStep
from lift3d.systems.pose_refinement import PoseRefinementHooks
from lift3d.systems.replicas import ReplicatedGaussians

log = logging.getLogger("lift3d.systems.reconstruct_gaussians")
# the pinned, non-blocking batch transfer below is meant to override the data module's default
warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")


@dataclass
class ReconstructGaussiansLoss(LossConfig):
    lambda_l1: Any = scheduled(0.8, low=0)  # weight of the L1 photometric term
    lambda_ssim: Any = scheduled(0.2, low=0)  # weight of D-SSIM = 1 - SSIM


@dataclass
class ReconstructGaussiansConfig(SystemConfig):
    # moved keys: the old place still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"densify.resolution_schedule": "resolution_schedule"}

    gaussians_type: str = "gaussians"  # the Gaussian model part
    gaussians: dict = field(default_factory=dict)  # its config
    renderer_type: str = "splat-rasterizer"  # the rasterizer part
    renderer: dict = field(default_factory=dict)  # its config
    densify_type: str = "densify-3dgs"  # the densification strategy part
    densify: dict = field(default_factory=dict)  # its config
    extent_scaled_params: list = field(default_factory=lambda: ["gaussians.means"])  # optimizer groups whose lr is x scene extent
    scene_extent: float = bounded(0.0, low=0)  # scene size for lr scaling and densification (0: from the data module's cameras)
    # [[step, factor], ...]: from each step on, the captured training step trains on photos factor x smaller a side
    # (e.g. [[0, 4], [1000, 2], [3000, 1]]; []: full size; lift3d.gaussians.resolution_schedule)
    resolution_schedule: list = step_count([], kind="pairs")
    # written when training ends; lift3d export takes any format
    export: ExportConfig = field(default_factory=lambda: ExportConfig(
        formats=["3dgs-ply"], video_distance=4.0, video_fovy_deg=50.0, video_elevation_deg=25.0))
    # DDP debug: every N steps check that all ranks hold the same Gaussians (0: off)
    replica_check_every: int = step_count(0, kind="kept")
    # several GPUs: each holds a shard of the Gaussians instead of a copy (scenes bigger than one GPU; auto: when a copy
    # would not fit its GPU's memory; lift3d.systems.shards)
    shard_gaussians: str = choice("auto", "true", "false", fold_case=True)
    cpu_threads: int = bounded(0, low=0)  # torch intra-op threads when running on CPU (0: torch's default; 1 avoids contention)
    # the training step (render, loss, backward) replayed as one CUDA graph where it can be: gsplat on a GPU, one device,
    # 32-bit precision (photos of several sizes train padded to one: one capture) (false: its kernels launched one by one)
    cuda_graphs: bool = True
    # captured steps: tile-intersection slots = this x the most any training view could need (each Gaussian at its
    # largest footprint), sized again at each capture
    isect_headroom: float = bounded(1.2, low=1)
    # per-photo color transforms (enabled: auto|true|false; lift3d.render.appearance)
    appearance: AppearanceConfig = field(default_factory=AppearanceConfig)
    # per-photo pose corrections (enabled: auto|true|false, lr; lift3d.render.pose_refinement)
    pose_refinement: PoseRefinementConfig = field(default_factory=PoseRefinementConfig)
    loss: ReconstructGaussiansLoss = field(default_factory=ReconstructGaussiansLoss)  # loss weights


def _scale_schedule(value: Any, factor: float) -> Any:
    """A number or schedule (see lift3d.schedule) with its values multiplied by ``factor``."""
    if not is_schedule(value):
        return value * factor
    items = list(value)
    mode = [items.pop()] if isinstance(items[-1], str) else []
    if items and is_schedule(items[0]):
        return [[step, v * factor] for step, v in items] + mode
    start, v0, v1, end = items
    return [start, v0 * factor, v1 * factor, end] + mode


def seen_in_kept_pixels(out: dict[str, Tensor], loss_mask: Tensor) -> dict[str, Tensor]:
    """The render with ``radii`` zeroed for Gaussians whose center falls on a pixel outside ``loss_mask`` [B, H, W, 1]
    (ignored, or padding): densification then counts a Gaussian as seen only in views where it was compared, so one
    seen only in ignored pixels is never grown, and views that ignore it do not dilute its mean gradient."""
    means2d = out["means2d"].detach()
    B, H, W = loss_mask.shape[:3]
    x, y = means2d[..., 0], means2d[..., 1]
    inside = (x >= 0) & (x < W) & (y >= 0) & (y < H)
    pixel = y.long().clamp(0, H - 1) * W + x.long().clamp(0, W - 1)
    kept = loss_mask.reshape(B, -1).gather(1, pixel) > 0.5
    seen = (kept | ~inside).to(out["radii"].dtype)
    return {**out, "radii": out["radii"] * (seen[..., None] if out["radii"].ndim == 3 else seen)}


@register("reconstruct-gaussians")
class ReconstructGaussiansSystem(AppearanceHooks, PoseRefinementHooks, ReplicatedGaussians, CapturedViews, BaseSystem):
    """Optimize Gaussians so their renders match posed photos."""

    Config = ReconstructGaussiansConfig
    auto_hull = "hull"  # init: auto on photos with masks and no SfM points: Gaussians fill the visual hull
    own_mesh_method = "density"  # the mesh of export.mesh_method=auto: marching cubes on the Gaussians' density

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.gaussians = self.build_part(self.cfg.gaussians_type, self.cfg.gaussians)
        self.renderer = self.build_part(self.cfg.renderer_type, self.cfg.renderer)
        self.densify = build_strategy(self, self.cfg.densify_type, self.cfg.densify)
        check_schedule(self.cfg.resolution_schedule)
        self.extent = self.cfg.scene_extent or 1.0
        self._last_render: dict[str, Tensor] | None = None
        self.appearance = PhotoAppearance(self.cfg.appearance)  # sized for the training photos in setup when on
        self.pose_refinement = PoseCorrections(self.cfg.pose_refinement)  # likewise: training poses only
        self._graphs = GraphedSplatStep(self)

    # ----------------------------------------------------------------------------------- set-up
    def setup(self, stage: str) -> None:
        on_cpu = self._trainer is not None and self.trainer.strategy.root_device.type == "cpu"
        if self.cfg.cpu_threads > 0 and on_cpu:
            torch.set_num_threads(self.cfg.cpu_threads)
        scene = self.scene
        if not self.cfg.scene_extent and scene is not None and scene.cameras is not None:
            self.extent = scene.extent
            if self.extent < 1e-6:  # a single view: fall back to its distance from the scene center
                self.extent = 1.1 * float(scene.cameras.positions.norm(dim=-1).mean())
        self.setup_appearance(scene)
        self.setup_pose_refinement(scene, self.extent)
        resuming = self._trainer is not None and self.trainer.ckpt_path is not None
        if stage == "fit" and len(self.gaussians) == 0 and not resuming:
            self._initialize(scene)

    def _initialize(self, scene: SceneSummary | None) -> None:
        from lift3d.gaussians import init

        c = self.gaussians.cfg
        photos = scene if scene is not None and scene.cameras is not None and scene.images is not None else None
        generator = torch.Generator().manual_seed(self.init_seed())
        method = c.init
        scene_points = scene.points if scene is not None else None
        if method == "auto":
            has_masks = photos is not None and photos.has_masks
            method = "sfm" if scene_points is not None else self.auto_hull if has_masks else "random"
        radius = c.init_radius or (init.visible_radius(photos.cameras) if photos is not None else 1.0)
        colors = normals = None
        if method in ("hull", "hull_surface") and photos is None:
            raise ValueError(f"gaussians.init: {method} needs a posed-images data module (images with alpha masks)")
        if method == "random":
            points = init.random_in_sphere(c.init_points, radius, generator)
        elif method == "hull":
            points, colors = init.carve_by_masks(photos.cameras, photos.images, c.init_points, radius, generator)
        elif method == "hull_surface":
            points, colors, normals = init.hull_surface(photos.cameras, photos.images, c.init_points, radius, generator)
        elif method == "sfm":
            if scene_points is None:
                raise ValueError("gaussians.init: sfm needs a scene with sparse points (a COLMAP model, or nerfstudio's "
                                 "ply_file_path); this one has none: use init: random or hull")
            points, colors = scene_points, scene.point_colors
        elif method == "points":
            points, colors = init.read_point_cloud(c.init_path)
        elif method == "mesh":
            points, colors = init.sample_mesh(c.init_path, c.init_points, up_axis=c.init_up_axis)
        elif method == "ply":
            self.gaussians.load_gaussian_file(c.init_path)  # every attribute as trained: nothing to initialize
            return
        else:
            raise ValueError(f"gaussians.init must be auto, random, hull, hull_surface, sfm, points, mesh or ply, "
                             f"got '{c.init}'")
        self.gaussians.initialize(points, colors, generator, normals)
        log.info("initialized %d Gaussians (%s) in a scene of extent %.2f", len(self.gaussians), method, self.extent)

    def configure_optimizers(self) -> Any:
        configured = super().configure_optimizers()
        optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
        for group in optimizer.param_groups:
            if group.get("name") in self.cfg.extent_scaled_params:
                group["lr"] *= self.extent
                if "lr_schedule" in group:
                    group["lr_schedule"] = _scale_schedule(group["lr_schedule"], self.extent)
        return configured

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """On CUDA, copy through pinned memory without blocking the host (keeps the GPU queue full)."""
        if device.type != "cuda" or not isinstance(batch, dict):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def move(x: Any) -> Any:
            if torch.is_tensor(x):
                return x.pin_memory().to(device, non_blocking=True)
            if isinstance(x, Cameras):
                return Cameras(move(x.c2w), move(x.intrinsics), x.width, x.height)
            return x

        return {key: move(value) for key, value in batch.items()}

    # ----------------------------------------------------------------------------------- training
    def render_gaussians(self, cameras: Cameras, background: Tensor | None, **options: Any) -> dict[str, Tensor]:
        """The rasterizer's output for ``cameras`` (``background`` [B, 3] or None; ``options`` to the rasterizer)."""
        return self.renderer(self.gaussians, cameras, background, self.gaussians.active_sh_degree, **options)

    def loss_terms(self, cameras: Cameras, background: Tensor | None, target: Tensor, loss_mask: Tensor | None = None,
                   index: Tensor | None = None, **options: Any) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(the photometric loss terms, the render) of one batch of views against its photos; with ``loss_mask``
        [B, H, W, 1] (1 = compare) over its pixels only: padding and ignored pixels pass no gradient, so Gaussians
        seen only there gather no densification gradient either. ``index`` [B]: the training photos, whose color
        transforms (per-photo appearance) the render is compared through and whose pose corrections (pose
        refinement) move the cameras."""
        cameras = self.pose_refinement(cameras, index)
        out = self.render_gaussians(cameras, background, with_depth=False, **options)  # the loss reads colors only
        rgb = self.appearance(out["rgb"], index)
        if loss_mask is None:
            l1 = (rgb - target).abs().mean()
            dssim = 1.0 - ssim(rgb, target).mean()
        else:
            kept = (loss_mask.sum() * target.shape[-1]).clamp_min(1.0)
            l1 = (masked_prediction(rgb, target, loss_mask) - target).abs().sum() / kept
            dssim = 1.0 - ssim(rgb, target, mask=loss_mask).mean()
        return {"l1": l1, "ssim": dssim}, out

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        replayed = self._graphs.run(batch) if self._graphs.applies(batch) else None
        if replayed is None:
            terms, out = self.loss_terms(batch["cameras"], batch["background"], batch["rgb"], batch.get("loss_mask"),
                                         index=self.training_index(batch))
        else:
            terms, out = replayed
        if batch.get("loss_mask") is not None:  # sharded: the statistics cover every rank's views
            out = seen_in_kept_pixels(out, self.all_views(batch["loss_mask"]))
        self._last_render = out
        self.log_step("train/gaussians", float(len(self.gaussians)))
        self.log_pose_corrections()
        return self.total_loss(terms)

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """After a replayed step the gradients are already computed: hand them to the parameters."""
        if not self._graphs.assign_gradients():
            super().backward(loss, *args, **kwargs)

    def on_after_backward(self) -> None:
        out, self._last_render = self._last_render, None
        self.sync_gradients()  # DDP: the mean over ranks, before densification reads or replaces the parameters
        optimizers = self._all_optimizers()
        self.densify.after_backward(out, self.gaussians, optimizers[0] if optimizers else None, self.true_global_step,
                                    self.extent)

    def training_index(self, batch: dict[str, Any]) -> Tensor | None:
        """The batch's training photos when appearance or pose refinement reads them (each warns once without)."""
        appearance, poses = self.appearance_index(batch), self.pose_index(batch)
        return appearance if appearance is not None else poses

    # ----------------------------------------------------------------------------------- checkpoints
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.gaussians.resize_to_state_dict(checkpoint["state_dict"], prefix="gaussians.")

    # ----------------------------------------------------------------------------------- evaluation
    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        self.gaussians.update_step(self.current_epoch if self._trainer is not None else 0, self.true_global_step)
        out = self.render_gaussians(batch["cameras"], batch.get("background"))
        return {"rgb": out["rgb"], "alpha": out["alpha"], "depth": out["depth"]}

    def on_fit_end(self) -> None:
        super().on_fit_end()
        self.export_at_fit_end()

    def export_sources(self) -> ExportSources:
        """The Gaussians (3dgs-ply, splat, spz, sog, gltf-splat), a mesh of their density colored by them (glb, obj;
        export.mesh_method=tsdf: their depths fused over the training views), in the capture's frame and units, and
        turntables."""
        g = self.gaussians
        tensors = GaussianTensors(g.means.detach(), g.scales.detach(), g.quats.detach(), g.opacities.detach(),
                                  colors=rgb_from_sh_dc(g.sh0.detach()[:, 0]))
        return self.in_capture_frame(gaussian_sources(
            tensors, self.cfg.export, write_3dgs_ply=lambda path, **kept: save_ply(path, g, **kept),
            gaussian_params=g.parameters_dict, render_fn=lambda cameras: self.render_views({"cameras": cameras}),
            device=self.device, antialiased=getattr(self.renderer.cfg, "rasterize_mode", "classic") == "antialiased",
            own_mesh_method=self.own_mesh_method, fusion_cameras=self.training_cameras()))
