"""Image-to-3D recipes: the text-to-3D systems plus a reference view that must show the input photo.

Each step renders the batch's random novel views (distilled by the guidance: Zero123, which is told the
reference image and camera, or the analytic prior in the offline twin) and the reference view, whose
RGB and silhouette are pulled towards the photo and its mask (``lambda_ref_rgb``, ``lambda_ref_mask``).
An optional second prior (``text_guidance_type``, e.g. Stable Diffusion with a prompt: Magic123's joint
prior) adds its own SDS term (``lambda_sds_text``). Three systems share this:

* ``image-gaussians``: 3D Gaussians with densification (DreamGaussian's first stage, ``dreamgaussian-image``);
* ``image-nerf``: a NeRF (``zero123-nerf``, ``magic123``);
* ``image-mesh``: a mesh stage started from either (``dreamgaussian-image-texture``, ``magic123-refine``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.config import scheduled
from lift3d.data.summary import ReferenceView
from lift3d.meshes.topology import edge_topology
from lift3d.registry import register
from lift3d.systems.dreamfusion import DreamFusionConfig, DreamFusionLoss, DreamFusionSystem
from lift3d.systems.gaussian_sds import GaussianSDSConfig, GaussianSDSSystem
from lift3d.systems.mesh_stages import MeshStageConfig, MeshStageLoss, MeshStageSystem
from lift3d.systems.text_to_3d import TextTo3DLoss

log = logging.getLogger(__name__)


@dataclass
class ReferenceLoss:
    """Weights of the reference-view terms and of the optional second prior."""

    lambda_ref_rgb: Any = scheduled(10000.0, low=0)  # mean squared error of the reference view's render against the photo
    lambda_ref_mask: Any = scheduled(1000.0, low=0)  # mean squared error of its opacity against the photo's mask
    lambda_sds_text: Any = scheduled(1.0, low=0)  # the second prior's SDS term (text_guidance_type)


@dataclass
class ReferenceOptions:
    """The optional second prior (Magic123: Stable Diffusion with a prompt beside Zero123)."""

    text_guidance_type: str = ""  # a second registered guidance ("" = none), e.g. stable-diffusion
    text_guidance: dict = dataclasses.field(default_factory=dict)  # its config (prompt, model, scale, ...)


class ReferenceViewMixin:
    """Reference-view losses, the reference handed to the guidance, and the optional second prior."""

    def reference(self) -> ReferenceView | None:
        """The scene's reference view (None without data, e.g. when only exporting)."""
        return self.scene.reference if self.scene is not None else None

    def build_guidance(self) -> Any:
        guidance = super().build_guidance()
        self._give_reference(guidance)
        return guidance

    def _give_reference(self, guidance: Any) -> None:
        reference = self.reference()
        if reference is not None and hasattr(guidance, "set_reference"):
            background = self.scene.background if self.scene.background is not None else torch.ones(3)
            guidance.set_reference(reference.composited(background), reference.elevation_deg, reference.azimuth_deg,
                                   reference.distance)

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.reference() is None:
            raise ValueError(f"{self.registered_name} needs a reference view: use data_type: single-image (data.image=PHOTO)")
        super().setup(stage)
        if stage == "fit" and self.cfg.text_guidance_type:
            self.text_guidance  # noqa: B018  (built now: an unreachable model fails before step 0)

    @property
    def text_guidance(self) -> Any:
        """The second prior, built on first use and kept out of the checkpoints."""
        return self.lazy_unsaved_part("text_guidance", self.cfg.text_guidance_type, self.cfg.text_guidance,
                                      update_step=True)

    def distill_priors(self, images: Tensor, batch: dict[str, Any]) -> dict[str, Tensor]:
        """The guidance's terms on the novel views, and the second prior's as ``sds_text``."""
        terms = self.distill(images, batch)
        if self.cfg.text_guidance_type and self.loss_weight("sds_text") != 0:
            out = self.text_guidance(images, batch)
            terms["sds_text"] = out["loss_sds"] / images.shape[0]
        return terms

    def reference_terms(self, out: dict[str, Tensor], batch: dict[str, Any]) -> dict[str, Tensor]:
        """Photo and silhouette errors of the reference view's render ``out`` (rgb, alpha [1, H, W, C])."""
        terms = {}
        if self.loss_weight("ref_rgb") != 0:
            terms["ref_rgb"] = (out["rgb"] - batch["ref_rgb"]).square().mean()
        if self.loss_weight("ref_mask") != 0:
            terms["ref_mask"] = (out["alpha"] - batch["ref_mask"]).square().mean()
        if self._is_logging_step():
            mse = (out["rgb"].detach() - batch["ref_rgb"]).square().mean()
            self.log_step("train/ref_psnr", -10.0 * torch.log10(mse.clamp_min(1e-10)))
        return terms


# ----------------------------------------------------------------------------------------- Gaussians
@dataclass
class ImageGaussiansLoss(TextTo3DLoss, ReferenceLoss):
    pass


@dataclass
class ImageGaussiansConfig(GaussianSDSConfig, ReferenceOptions):
    guidance_type: str = "zero123"  # the novel-view prior
    loss: ImageGaussiansLoss = dataclasses.field(default_factory=ImageGaussiansLoss)  # loss weights


@register("image-gaussians")
class ImageGaussiansSystem(ReferenceViewMixin, GaussianSDSSystem):
    """3D Gaussians from one image (DreamGaussian's first stage)."""

    Config = ImageGaussiansConfig

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        cameras = batch["cameras"]
        out = self.render_gaussians(cameras, self.backgrounds(len(cameras), self.true_global_step))
        self._last_render = out
        terms = self.distill_priors(out["rgb"], batch)
        reference = self.render_gaussians(batch["ref_cameras"], batch["ref_background"])
        terms.update(self.reference_terms(reference, batch))
        self.log_step("train/gaussians", float(len(self.gaussians)))
        return self.total_loss(terms)


# ----------------------------------------------------------------------------------------- NeRF
@dataclass
class ImageNeRFLoss(DreamFusionLoss, ReferenceLoss):
    pass


@dataclass
class ImageNeRFConfig(DreamFusionConfig, ReferenceOptions):
    guidance_type: str = "zero123"  # the novel-view prior
    loss: ImageNeRFLoss = dataclasses.field(default_factory=ImageNeRFLoss)  # loss weights


@register("image-nerf")
class ImageNeRFSystem(ReferenceViewMixin, DreamFusionSystem):
    """A NeRF from one image (threestudio's zero123 recipe; Magic123's coarse stage with a text prior)."""

    Config = ImageNeRFConfig

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        out = self.render_for_training(batch)
        terms = self.distill_priors(out["rgb"], batch)
        terms.update(self.regularizers(out))
        reference = self.renderer(batch["ref_cameras"], background=batch["ref_background"])
        terms.update(self.reference_terms(reference, batch))
        self.log_step("train/opacity", out["alpha"].detach().mean())
        return self.total_loss(terms)


# ----------------------------------------------------------------------------------------- meshes
@dataclass
class ImageMeshLoss(MeshStageLoss, ReferenceLoss):
    pass


@dataclass
class ImageMeshConfig(MeshStageConfig, ReferenceOptions):
    guidance_type: str = "zero123"  # the novel-view prior
    loss: ImageMeshLoss = dataclasses.field(default_factory=ImageMeshLoss)  # loss weights


@register("image-mesh")
class ImageMeshSystem(ReferenceViewMixin, MeshStageSystem):
    """A mesh stage of image-to-3D: the reference view stays pinned to the photo while the prior refines."""

    Config = ImageMeshConfig

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        mesh = self.geometry()
        topology = edge_topology(mesh.faces)
        out = self.render_mesh(mesh, batch, topology)
        terms = self.distill_priors(out["rgb"], batch)
        terms.update(self.regularizers(mesh, topology))
        reference = self.render_mesh(mesh, {"cameras": batch["ref_cameras"], "background": batch["ref_background"]}, topology)
        terms.update(self.reference_terms(reference, batch))
        self.log_step("train/faces", float(mesh.num_faces))
        return self.total_loss(terms)
