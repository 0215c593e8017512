"""The shared base of text-to-3D recipes: a representation distilled from a 2D prior (SDS / VSD).

Interface for recipe and stage systems (kept stable; mesh stages build on it):

* ``render(batch) -> dict`` — evaluation renders of ``batch["cameras"]`` (``batch.get("background")``
  [B, 3] and ``batch.get("light_positions")`` [B, 3] optional): ``rgb``, ``alpha``, ``depth`` and
  optionally ``normal``, each [B, H, W, C]. Validation grids, test videos and exporters call it.
* ``training_step(batch, batch_idx)`` — usually: render the training views, ``terms =
  self.distill(images, batch)`` (the guidance's per-view loss, keyed ``sds`` / ``vsd``), add the
  recipe's regularizers, ``return self.total_loss(terms)`` (weights ``system.loss.lambda_<term>``).
* ``export_sources() -> ExportSources`` — what ``lift3d.export`` can write (mesh, colors, Gaussians,
  render function); the base writes ``system.export.formats`` after the test views and on ``lift3d export``.
* ``convert_from(previous, previous_cfg)`` — start from a previous stage: ``system.geometry_convert_from=
  <previous run>/ckpts/last.ckpt`` rebuilds that run from its ``configs/parsed.yaml`` (optionally changed
  by ``system.geometry_convert_override``), loads its weights on the CPU and calls this hook in
  ``setup("fit")`` before the guidance is built and before a resumed checkpoint is restored over it.
  The default raises (no conversion). ``lift3d.systems.stages.load_previous_stage`` does the loading.
* ``build_guidance()`` — builds the configured guidance; tests and benchmarks replace it (e.g. to pass
  random-weight models).

What the base gives them:

* the guidance, held as an unsaved part (frozen weights never enter checkpoints; VSD's LoRA state does,
  through its ``checkpoint_state``), built when training starts (so an unreachable model fails before
  the first step) or lazily when evaluation needs it — never for ``lift3d export``;
* ``distill``: the guidance's loss per view, with its gradient norm, timesteps and LoRA loss logged;
* validation grids rgb | normal | depth | opacity | the guidance's one-step denoised estimate of the render;
* the final asset exported (``system.export.formats``) after the test views are rendered, and on
  ``lift3d export``;
* stage chaining as above.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.aftercare import attempt
from lift3d.config import bounded, scheduled
from lift3d.systems.base import BaseSystem, LossConfig, SystemConfig
from lift3d.systems.stages import load_previous_stage

log = logging.getLogger(__name__)

GUIDANCE_LOSSES = ("loss_sds", "loss_vsd")  # what guidances return; the loss term is the name without "loss_"


@dataclass
class TextTo3DLoss(LossConfig):
    """Weights of the distillation terms (each a per-view mean: independent of the batch size)."""

    lambda_sds: Any = scheduled(1.0, low=0)  # SDS term (stable-diffusion and analytic guidance)
    lambda_vsd: Any = scheduled(1.0, low=0)  # VSD term (stable-diffusion-vsd guidance)


@dataclass
class TextTo3DConfig(SystemConfig):
    """Options every text-to-3D recipe has: the guidance, stage chaining, validation panels, export."""

    guidance_type: str = "stable-diffusion"  # registered guidance: stable-diffusion, stable-diffusion-vsd, analytic
    guidance: dict = dataclasses.field(default_factory=dict)  # its config (prompt, model, scale, timesteps, ...)
    geometry_convert_from: str = ""  # a previous stage's checkpoint to start from (its configs/parsed.yaml is read too)
    # changes to that stage's system config before loading
    geometry_convert_override: dict = dataclasses.field(default_factory=dict)
    guidance_panel: bool = True  # validation grids add the guidance's one-step denoised estimate of each render
    guidance_panel_t: float = bounded(0.5, low=0, high=1)  # timestep of that estimate, as a fraction of the diffusion model's T
    export_after_test: bool = True  # export the asset (export.formats) into save/ whenever the test views are rendered
    matmul_precision: str = "high"  # torch.set_float32_matmul_precision on CUDA (high: TF32 matmuls)
    loss: TextTo3DLoss = dataclasses.field(default_factory=TextTo3DLoss)  # loss weights


class TextTo3DSystem(BaseSystem):
    """Base of distillation recipes; see the module docstring for what subclasses implement."""

    Config = TextTo3DConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self._pending_guidance_state: dict[str, Any] | None = None
        self._guidance_failed = False
        self._validating = False

    # ------------------------------------------------------------------------------ the guidance
    def build_guidance(self) -> Any:
        """The configured guidance (loads the diffusion model; tests and benchmarks may override this)."""
        return self.build_part(self.cfg.guidance_type, self.cfg.guidance)

    @property
    def has_guidance(self) -> bool:
        return "guidance" in self._unsaved

    @property
    def guidance(self) -> Any:
        """The guidance, built on first use and placed on the system's device."""
        if "guidance" not in self._unsaved:
            guidance = self.build_guidance()
            if self._pending_guidance_state is not None:
                guidance.load_checkpoint_state(self._pending_guidance_state)
                self._pending_guidance_state = None
            self.add_unsaved_part("guidance", guidance)
            guidance.to(self.device)
            guidance.update_step(self.current_epoch if self._trainer is not None else 0, self.true_global_step)
        return self._unsaved["guidance"]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if not self.has_guidance and "part:guidance" in checkpoint:
            self._pending_guidance_state = checkpoint["part:guidance"]  # applied when the guidance is built

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if not self.has_guidance and self._pending_guidance_state is not None:
            checkpoint["part:guidance"] = self._pending_guidance_state

    # ------------------------------------------------------------------------------ stages
    def setup(self, stage: str) -> None:
        """Before training (and before a resumed checkpoint is restored over it): start from the previous
        stage if one is given, then build the guidance so an unreachable model fails before step 0."""
        if stage != "fit":
            return
        if self._trainer is not None:
            self.apply_matmul_precision(self.trainer.strategy.root_device)
        if self.cfg.geometry_convert_from:
            previous_cfg, previous = load_previous_stage(self.cfg.geometry_convert_from, self.cfg.geometry_convert_override)
            self.convert_from(previous, previous_cfg)
        self.guidance  # noqa: B018  (built for its side effect)

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        """Take the starting state from a previous stage's system (weights loaded, on the CPU)."""
        raise NotImplementedError(
            f"a {self.registered_name} run cannot start from a {previous_cfg.system_type} run "
            "(system.geometry_convert_from): this recipe has no conversion from it"
        )

    # ------------------------------------------------------------------------------ training helpers
    def distill(self, images: Tensor, batch: dict[str, Any]) -> dict[str, Tensor]:
        """The guidance's loss on renders ``images`` [B, H, W, C] as a per-view mean, keyed by term
        ("sds" or "vsd"); logs the gradient norm, the mean timestep and VSD's LoRA loss."""
        out = self.guidance(images, batch)
        n = images.shape[0]
        terms = {key[len("loss_"):]: out[key] / n for key in GUIDANCE_LOSSES if key in out}
        if not terms:
            raise KeyError(f"the guidance returned none of {', '.join(GUIDANCE_LOSSES)} (got {sorted(out)})")
        self.log_step("train/grad_norm", out["grad_norm"])
        self.log_step("train/timestep", out["timesteps"].float().mean())
        if "loss_lora" in out:
            self.log_step("train/loss_lora", out["loss_lora"])
        return terms

    # ------------------------------------------------------------------------------ evaluation
    def render(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Evaluation renders of the batch's cameras: {"rgb", "alpha", "depth", "normal"?} [B, H, W, C]."""
        raise NotImplementedError(f"{type(self).__name__} must implement render")

    def render_views(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        out = self.render(batch)
        if self._validating and self.cfg.guidance_panel:
            estimate = self.guidance_estimate(out["rgb"], batch)
            if estimate is not None:
                out["guidance_estimate"] = estimate
        return out

    def _panel_guidance(self) -> Any:
        """The guidance for validation panels, or None (with one warning) where it cannot be built."""
        if self._guidance_failed:
            return None
        try:
            return self.guidance
        except Exception as error:  # evaluating a run offline must not fail over its panel
            self._guidance_failed = True
            log.warning("validation grids leave out the guidance panel: %s", str(error).splitlines()[0])
            return None

    def guidance_estimate(self, rgb: Tensor, batch: dict[str, Any]) -> Tensor | None:
        """The guidance's denoised estimate [B, H, W, 3] of renders ``rgb`` noised to ``guidance_panel_t`` (None where
        the guidance gives none: a prior without a noise schedule or denoised images, e.g. a user's own)."""
        guidance = self._panel_guidance()
        if guidance is None:
            return None
        try:
            image = self._denoised(guidance, rgb, batch)
        except (AttributeError, KeyError, TypeError) as error:  # a guidance without the panel's interface
            self._guidance_failed = True
            log.warning("validation grids leave out the guidance panel: %s gives no denoised estimate (%s)",
                        type(guidance).__name__, str(error).splitlines()[0] if str(error) else type(error).__name__)
            return None
        height, width = rgb.shape[1:3]
        if image.shape[-2:] != (height, width):
            image = F.interpolate(image, (height, width), mode="bilinear", align_corners=False, antialias=True)
        return image.permute(0, 2, 3, 1).clamp(0, 1).to(rgb.device)

    def _denoised(self, guidance: Any, rgb: Tensor, batch: dict[str, Any]) -> Tensor:
        """[B, 3, H', W'] the guidance's one-step denoised estimate of ``rgb`` noised to ``guidance_panel_t``."""
        with torch.inference_mode():  # never trains anything (VSD's LoRA steps only outside inference mode)
            t = round(self.cfg.guidance_panel_t * (guidance.num_train_timesteps - 1))
            latent = getattr(guidance, "latent_input", False)
            if latent:
                guidance.latent_input = False  # evaluation renders are RGB
            try:
                out = guidance(rgb.float(), batch, return_images=True, timesteps=torch.full((len(rgb),), t, device=rgb.device))
            finally:
                if latent:
                    guidance.latent_input = True
            return out["images"]["denoised"].permute(0, 3, 1, 2).float()

    def grid_panels(self, out: dict[str, Tensor], batch: dict[str, Any], i: int) -> list[tuple[str, Tensor, str]]:
        panels = super().grid_panels(out, batch, i)
        if "guidance_estimate" in out:
            panels.append(("rgb", out["guidance_estimate"][i], "guidance"))
        return panels

    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._validating = True

    def on_validation_end(self) -> None:
        self._validating = False
        super().on_validation_end()

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        if self.cfg.export_after_test and self.trainer.is_global_zero:
            attempt("the export", self.export, self.saver, list(self.cfg.export.formats))  # each format logs its file
