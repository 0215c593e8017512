"""Recipe ``reconstruct-surfels``: 2D Gaussian surfels from posed photos (2DGS, Huang et al. 2024), meshed by TSDF fusion
of their rendered depth.

The 3DGS recipe (``reconstruct-gaussians``: photometric loss, learning rates, densification, appearance and pose
refinement) with surfels (``gaussians``: flat third scale) rasterized by ``surfel-rasterizer``, plus 2DGS's two
geometry terms: normal consistency (the surfels' rendered normals against the normals of the rendered depth, weight
``loss.lambda_normal`` from step ``normal_start``) and depth distortion (``loss.lambda_distortion`` from step
``distortion_start``). Densification reads the gradient of each surfel's projected center (gsplat's ``gradient_2dgs``).
The run keeps its training cameras, so ``lift3d export`` fuses the mesh from the views the surfels were fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.config import ConfigError, scheduled, step_count
from lift3d.data.summary import SceneSummary
from lift3d.export import ExportConfig, ExportSources, GaussianTensors, gaussian_sources
from lift3d.export.tsdf_sources import in_capture_frame
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.formats.splat import rgb_from_sh_dc
from lift3d.registry import register
from lift3d.systems.reconstruct_gaussians import (
    ReconstructGaussiansConfig,
    ReconstructGaussiansLoss,
    ReconstructGaussiansSystem,
)


@dataclass
class ReconstructSurfelsLoss(ReconstructGaussiansLoss):
    lambda_normal: Any = scheduled(0.05, low=0)  # normal consistency 1 - n . n_depth (2DGS's weight), from system.normal_start
    lambda_distortion: Any = scheduled(0.01, low=0)  # depth distortion (L1 form, scene units), from system.distortion_start


@dataclass
class ReconstructSurfelsConfig(ReconstructGaussiansConfig):
    gaussians_type: str = "surfels"  # the surfel model part (a Gaussian model with a flat third scale)
    renderer_type: str = "surfel-rasterizer"  # the surfel rasterizer part
    normal_start: int = step_count(7000)  # first step of the normal-consistency term (2DGS: 7000 of 30000)
    distortion_start: int = step_count(3000)  # first step of the depth-distortion term (2DGS: 3000 of 30000)
    cuda_graphs: bool = False  # surfel steps run kernel by kernel (no captured step for the surfel rasterizer)
    # written when training ends: the mesh fused from rendered depth (export.tsdf); lift3d export takes any format
    export: ExportConfig = field(default_factory=lambda: ExportConfig(
        formats=["glb"], video_distance=4.0, video_fovy_deg=50.0, video_elevation_deg=25.0))
    loss: ReconstructSurfelsLoss = field(default_factory=ReconstructSurfelsLoss)  # loss weights


def masked_mean(values: Tensor, loss_mask: Tensor | None) -> Tensor:
    """Mean of ``values`` [B, H, W, 1] over the pixels ``loss_mask`` [B, H, W, 1] keeps (all when None)."""
    if loss_mask is None:
        return values.mean()
    return (values * loss_mask).sum() / loss_mask.sum().clamp_min(1.0)


def normal_consistency(out: dict[str, Tensor]) -> Tensor:
    """[B, H, W, 1] 2DGS's normal error ``1 - n . (alpha n_depth)``: the surfels' accumulated normals against the unit
    normals of the rendered depth, weighted by the (constant) opacity."""
    return 1 - (out["normal"] * out["surface_normal"] * out["alpha"].detach()).sum(-1, keepdim=True)


@register("reconstruct-surfels")
class ReconstructSurfelsSystem(ReconstructGaussiansSystem):
    """Optimize surfels so their renders match posed photos and their surfaces agree with their depths."""

    Config = ReconstructSurfelsConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.cuda_graphs:
            raise ConfigError("system.cuda_graphs: the surfel rasterizer has no captured training step; "
                              "set system.cuda_graphs=false")
        if getattr(self.densify.cfg, "absgrad", False):
            raise ConfigError("system.densify.absgrad: the surfel rasterizer gives no absolute gradients; "
                              "set system.densify.absgrad=false")
        # the training views, kept in checkpoints: the views the export fuses the mesh from (empty until training)
        self.register_buffer("train_c2w", torch.zeros(0, 4, 4))
        self.register_buffer("train_intrinsics", torch.zeros(0, 3, 3))
        self.register_buffer("train_size", torch.zeros(2, dtype=torch.long))
        # the similarity the data module applied to the capture's poses: meshes are written back in the capture's frame
        self.register_buffer("world_from_capture", torch.eye(4, dtype=torch.float64))

    # ----------------------------------------------------------------------------------- set-up
    def set_scene(self, scene: SceneSummary | None) -> None:
        """Keep the training views (the views the export fuses the mesh from) and the similarity the data module
        applied to the capture's poses (meshes are written back in the capture's frame)."""
        super().set_scene(scene)
        if scene is None or scene.cameras is None:
            return
        cameras = scene.cameras
        self.train_c2w = cameras.c2w.detach().float().to(self.train_c2w.device)
        self.train_intrinsics = cameras.intrinsics.detach().float().to(self.train_c2w.device)
        self.train_size = torch.tensor([cameras.width, cameras.height], device=self.train_c2w.device)
        if scene.world_from_capture is not None:
            self.world_from_capture = scene.world_from_capture.to(torch.float64).to(self.train_c2w.device)

    def training_cameras(self) -> Cameras | None:
        """The views the surfels were fitted to (None for a run that has not trained)."""
        if len(self.train_c2w) == 0:
            return None
        width, height = (int(v) for v in self.train_size.tolist())
        return Cameras(self.train_c2w, self.train_intrinsics, width, height)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint["state_dict"]
        for name in ("train_c2w", "train_intrinsics"):
            if name in state:
                setattr(self, name, torch.zeros_like(state[name], device=getattr(self, name).device))

    # ----------------------------------------------------------------------------------- training
    def loss_weight(self, term: str) -> float:
        """The weight of ``term`` at this step; the geometry terms are 0 before their start steps."""
        start = {"normal": self.cfg.normal_start, "distortion": self.cfg.distortion_start}.get(term)
        if start is not None and self.true_global_step < start:
            return 0.0
        return super().loss_weight(term)

    def loss_terms(self, cameras: Cameras, background: Tensor | None, target: Tensor, loss_mask: Tensor | None = None,
                   index: Tensor | None = None, **options: Any) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The photometric terms of the Gaussian recipe and, from their start steps, normal consistency and depth
        distortion over the compared pixels."""
        terms, out = super().loss_terms(cameras, background, target, loss_mask, index, **options)
        if self.loss_weight("normal") != 0:
            terms["normal"] = masked_mean(normal_consistency(out), loss_mask)
        if self.loss_weight("distortion") != 0:
            terms["distortion"] = masked_mean(out["distortion"], loss_mask)
        return terms, out

    def on_after_backward(self) -> None:
        """Densification reads the gradient of each surfel's projected center (filled by the backward pass)."""
        if self._last_render is not None and "densify_grad" in self._last_render:
            self._last_render = {**self._last_render, "means2d_grad": self._last_render["densify_grad"]}
        super().on_after_backward()

    # ----------------------------------------------------------------------------------- evaluation and export
    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        self.gaussians.update_step(self.current_epoch if self._trainer is not None else 0, self.true_global_step)
        out = self.render_gaussians(batch["cameras"], batch.get("background"))
        return {key: out[key] for key in ("rgb", "alpha", "depth", "median_depth", "normal", "surface_normal")}

    def export_sources(self) -> ExportSources:
        """The surfels as Gaussian files, and a mesh fused from their rendered depths (export.tsdf) over the training
        views, colored from the renders, in the capture's frame and units (glb, obj, mesh-ply); turntables."""
        g = self.gaussians
        tensors = GaussianTensors(g.means.detach(), g.scales.detach(), g.quats.detach(), g.opacities.detach(),
                                  colors=rgb_from_sh_dc(g.sh0.detach()[:, 0]))
        sources = gaussian_sources(tensors, self.cfg.export, write_3dgs_ply=lambda path, **kept: save_ply(path, g, **kept),
                                   gaussian_params=g.parameters_dict,
                                   render_fn=lambda cameras: self.render_views({"cameras": cameras}), device=self.device,
                                   own_mesh_method="tsdf", fusion_cameras=self.training_cameras())
        return in_capture_frame(sources, self.world_from_capture.cpu().numpy())
