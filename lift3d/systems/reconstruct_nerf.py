"""Recipe ``reconstruct-nerf``: fit an implicit volume (hash grid) to posed photos by volume rendering.

Wires a field, a material, a background and the volume renderer; the photometric loss compares
rendered rays (``batch_mode: rays``) or whole images (``batch_mode: image``) with the photos. Validation
scores PSNR/SSIM on the val split into ``save/metrics.json``; test renders the orbit video.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import choice, scheduled
from lift3d.export import ExportConfig, ExportSources
from lift3d.registry import register
from lift3d.render.appearance import AppearanceConfig, PhotoAppearance
from lift3d.systems.appearance import AppearanceHooks
from lift3d.systems.base import MATMUL_PRECISIONS, BaseSystem, LossConfig, SystemConfig
from lift3d.systems.captured_views import CapturedViews
from lift3d.systems.field_queries import FieldQueries


@dataclass
class ReconstructNerfLoss(LossConfig):
    lambda_rgb: Any = scheduled(1.0, low=0)  # photometric loss on the composited color
    lambda_alpha: Any = scheduled(0.0, low=0)  # MSE between rendered opacity and the photo's alpha (object masks)
    lambda_sparsity: Any = scheduled(0.0, low=0)  # mean rendered opacity (discourages floaters)
    # renderer sampler proposal: the proposal networks' histogram loss (their only training signal)
    lambda_interlevel: Any = scheduled(1.0, low=0)
    # renderer sampler proposal: Mip-NeRF 360's distortion loss (pulls each ray's weight together)
    lambda_distortion: Any = scheduled(0.0, low=0)


@dataclass
class ReconstructNerfConfig(SystemConfig):
    field_type: str = "implicit-volume"  # registered field
    field: dict = dataclasses.field(default_factory=lambda: {"radius": 1.5, "n_feature_dims": 15})  # its config
    material_type: str = "neural-radiance"  # registered material
    material: dict = dataclasses.field(default_factory=dict)  # its config
    background_type: str = "solid-color"  # registered background (batches with a background override it)
    background: dict = dataclasses.field(default_factory=dict)  # its config
    renderer_type: str = "volume-renderer"  # registered renderer
    renderer: dict = dataclasses.field(default_factory=dict)  # its config
    photometric_loss: str = choice("mse", "smooth_l1")  # squared error, or smooth L1 (beta 0.1)
    eval_normals: bool = True  # render normals for validation grids (finite differences: slower renders)
    # torch.set_float32_matmul_precision on CUDA (high: TF32 matmuls)
    matmul_precision: str = choice("high", among=MATMUL_PRECISIONS)
    # the training step (render, loss, backward) replayed as one CUDA graph where it can be: a GPU, ray batches, 32-bit
    # precision, one device (false: its kernels launched one by one)
    cuda_graphs: bool = True
    # per-photo color transforms (enabled: auto|true|false; lift3d.render.appearance)
    appearance: AppearanceConfig = dataclasses.field(default_factory=AppearanceConfig)
    loss: ReconstructNerfLoss = dataclasses.field(default_factory=ReconstructNerfLoss)  # loss weights
    # what lift3d export writes by default
    export: ExportConfig = dataclasses.field(default_factory=lambda: ExportConfig(
        formats=["glb"], video_distance=4.0, video_fovy_deg=50.0, video_elevation_deg=25.0))


@register("reconstruct-nerf")
class ReconstructNerfSystem(AppearanceHooks, FieldQueries, CapturedViews, BaseSystem):
    """Photometric NeRF reconstruction with a hash-grid field and an occupancy-grid renderer."""

    Config = ReconstructNerfConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        self.field = self.build_part(c.field_type, c.field)
        self.material = self.build_part(c.material_type, c.material)
        self.background = self.build_part(c.background_type, c.background)
        self.renderer = self.build_part(c.renderer_type, c.renderer, self.field, self.material, self.background)
        self.appearance = PhotoAppearance(c.appearance)  # sized for the training photos in setup when on
        self._captured: Any = None  # CapturedStep, made on the first step that can be captured
        self._replayed = False

    def setup(self, stage: str) -> None:
        self.setup_appearance(self.scene)

    # ------------------------------------------------------------------------------ training
    def _photometric(self, prediction: Tensor, target: Tensor) -> Tensor:
        if self.cfg.photometric_loss == "mse":
            return ((prediction - target) ** 2).mean(-1)
        return F.smooth_l1_loss(prediction, target, reduction="none", beta=0.1).mean(-1)

    def loss_terms(self, batch: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
        """Render the batch and compare it with the photos -> (loss terms, rendered rays [N, C], target rgb [N, 3]).

        Rays outside the renderer's sample budget (``ray_valid`` False), and pixels outside the batch's ``loss_mask``
        (padding of photos of several sizes, ignored pixels), are left out of every term: the rays' ``weight`` [N] is
        0 for them, 1 for the others. (Ray batches hold kept pixels only.)"""
        if "rays_o" in batch:
            out = self.renderer.render_rays(batch["rays_o"], batch["rays_d"], background=batch.get("background"))
            out = {**out, "rgb": self.appearance(out["rgb"], self.appearance_index(batch))}  # each ray in its photo's look
            target, target_alpha = batch["rgb"], batch.get("alpha")
        else:
            images = self.renderer(batch["cameras"], background=batch.get("background"))
            images = {**images, "rgb": self.appearance(images["rgb"], self.appearance_index(batch))}
            out = {k: images[k].reshape(-1, images[k].shape[-1]) for k in ("rgb", "alpha")}
            out.update({k: images[k].reshape(-1) for k in ("ray_valid", "interlevel", "distortion") if k in images})
            out.update({k: images[k] for k in ("num_samples",) if k in images})
            target = batch["rgb"].reshape(-1, 3)
            target_alpha = batch["alpha"].reshape(-1, 1) if "alpha" in batch else None
        valid = out.get("ray_valid")
        weight = torch.ones_like(out["rgb"][:, 0]) if valid is None else valid.reshape(-1).float()
        if batch.get("loss_mask") is not None:
            weight = weight * batch["loss_mask"].reshape(-1).to(weight.dtype)
        count = weight.sum().clamp_min(1.0)
        error = self._photometric(out["rgb"], target)
        terms = {"rgb": (error * weight).sum() / count}
        if target_alpha is not None and self.loss_weight("alpha") != 0:
            terms["alpha"] = (((out["alpha"] - target_alpha) ** 2).reshape(-1) * weight).sum() / count
        if self.loss_weight("sparsity") != 0:
            terms["sparsity"] = out["alpha"].mean()
        for name in ("interlevel", "distortion"):  # per-ray terms of the proposal sampler
            if name in out and self.loss_weight(name) != 0:
                terms[name] = (out[name] * weight).sum() / count
        rays = {k: out[k] for k in ("rgb", "alpha", "num_samples") if k in out}
        return terms, {**rays, "weight": weight}, target

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        self._replayed = False
        captured = self._captured_terms(batch) if self._can_capture(batch) else None
        if captured is None:
            terms, out, target = self.loss_terms(batch)
        else:
            terms, out, target = captured
            self._replayed = True
        if self._is_logging_step():
            weight = out["weight"]
            mse = (((out["rgb"].detach() - target) ** 2).mean(-1) * weight).sum() / weight.sum().clamp_min(1.0)
            self.log_step("train/psnr", -10.0 * torch.log10(mse.clamp_min(1e-10)), prog_bar=True)
            if "num_samples" in out:
                self.log_step("train/samples_per_ray", out["num_samples"] / out["rgb"].shape[0])
            self.log_step("train/occupancy", self.renderer.occupancy.occupancy_fraction())
        return self.total_loss(terms)

    # ------------------------------------------------------------------------------ the step as a CUDA graph
    def _can_capture(self, batch: dict[str, Any]) -> bool:
        """Whether this step may run as a replayed CUDA graph: ray batches on a GPU, one process, 32-bit
        precision, one batch a step (see ``cuda_graphs``)."""
        if not self.cfg.cuda_graphs or "rays_o" not in batch or not batch["rays_o"].is_cuda:
            return False
        trainer = self._trainer
        if trainer is None or trainer.world_size != 1 or trainer.accumulate_grad_batches != 1:
            return False
        return str(trainer.precision) in ("32-true", "32")

    def _graph_key(self, n_rays: int, device: torch.device) -> tuple | None:
        """Everything a captured step bakes in: the renderer's sample budgets, the loss weights, and the
        per-step choices of the parts (active hash-grid levels, the material's shading)."""
        renderer_key = self.renderer.graph_key(n_rays, device)
        if renderer_key is None:
            return None
        weights = tuple((name, self.loss_weight(name)) for name in ("rgb", "alpha", "sparsity", "interlevel", "distortion"))
        parts = (getattr(getattr(self.field, "encoding", None), "active_levels", None),
                 getattr(self.material, "training_shading", None))
        return renderer_key, weights, parts

    def _captured_terms(self, batch: dict[str, Any]) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor] | None:
        """The step's loss terms by replaying its CUDA graph (captured again when its key changes); the gradients
        wait in the graph until ``backward``. None: this step runs eagerly (the renderer has no sample budgets yet)."""
        names = ("rays_o", "rays_d", "rgb", "alpha", "background", "loss_mask", "index")
        inputs = {k: v for k, v in batch.items() if torch.is_tensor(v) and k in names}
        key = self._graph_key(inputs["rays_o"].shape[0], inputs["rays_o"].device)
        if key is None:
            return None
        if self._captured is None:
            from lift3d.systems.captured_step import CapturedStep

            self._captured = CapturedStep([p for p in self.parameters() if p.requires_grad],
                                          hint="set system.cuda_graphs=false to train with the step launched kernel by kernel")

        def compute(static: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
            self.renderer.begin_graph_capture()
            try:
                terms, out, target = self.loss_terms(static)
            finally:
                self.renderer.end_graph_capture()
            return self.weighted_sum(terms), {**{f"term:{k}": v for k, v in terms.items()}, **out, "target": target}

        outputs = self._captured.run(key, inputs, compute)
        self.renderer.record_graph_counts()
        terms = {k[len("term:"):]: v for k, v in outputs.items() if k.startswith("term:")}
        out = {k: v for k, v in outputs.items() if not k.startswith("term:") and k not in ("loss", "target")}
        return terms, out, outputs["target"]

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """After a replayed step the gradients are already computed: hand them to the parameters."""
        if self._replayed and self._captured is not None:
            self._captured.assign_gradients()
            return
        super().backward(loss, *args, **kwargs)

    # ------------------------------------------------------------------------------ evaluation
    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        out = self.renderer(batch["cameras"], background=batch.get("background"), compute_normals=self.cfg.eval_normals)
        return {k: out[k] for k in ("rgb", "alpha", "depth", "normal") if k in out}

    def export_sources(self) -> ExportSources:
        """The density's mesh colored by the albedo, in the capture's frame and units, and turntables."""
        return self.in_capture_frame(super().export_sources())
