"""Recipe ``reconstruct-surfels``: 2D Gaussian surfels from posed photos (2DGS, Huang et al. 2024), meshed by TSDF fusion
of their rendered depth.

The 3DGS recipe (``reconstruct-gaussians``: photometric loss, learning rates, densification, appearance and pose
refinement) with surfels (``gaussians``: flat third scale) rasterized by ``surfel-rasterizer``, plus 2DGS's two
geometry terms: normal consistency (the surfels' rendered normals against the normals of the rendered depth, weight
``loss.lambda_normal`` from step ``normal_start``) and depth distortion (``loss.lambda_distortion`` from step
``distortion_start``). Densification reads the gradient of each surfel's projected center (gsplat's ``gradient_2dgs``).
The run keeps its training cameras (``CapturedViews``), so ``lift3d export`` fuses the mesh from the views the surfels
were fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.config import ConfigError, scheduled, step_count
from lift3d.export import ExportConfig
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
    auto_hull = "hull_surface"  # surfels start on the masks' visual hull, facing out, not inside the object
    own_mesh_method = "tsdf"  # their median depths fused over the training views

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.cuda_graphs:
            raise ConfigError("system.cuda_graphs: the surfel rasterizer has no captured training step; "
                              "set system.cuda_graphs=false")
        if getattr(self.densify.cfg, "absgrad", False):
            raise ConfigError("system.densify.absgrad: the surfel rasterizer gives no absolute gradients; "
                              "set system.densify.absgrad=false")

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
