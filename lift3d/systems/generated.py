"""Recipe ``generated-nerf``: image to 3D by a feed-forward generator (TripoSR), optionally refined by distillation.

Before training, the registered generator (``generator_type``) turns the reference photo into a field in one
forward pass and the system's ``field`` takes its weights; the generator is then released. Without a
guidance (``guidance_type: ""``: the ``triposr`` recipe) the run is one bookkeeping step, so the generated
field is checkpointed, rendered and exported (textured .glb) like any NeRF run, and ``lift3d export`` /
``lift3d view`` open it. With a guidance (``triposr-refine``, started from that run by
``geometry_convert_from``) it is the image-NeRF recipe (``image-nerf``: the reference view pinned to the
photo, Zero123 or the analytic prior on novel views) starting from the generated shape instead of a blob.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.config import ConfigError
from lift3d.registry import register
from lift3d.systems.image_to_3d import ImageNeRFConfig, ImageNeRFSystem

log = logging.getLogger(__name__)


@dataclass
class GeneratedNeRFConfig(ImageNeRFConfig):
    generator_type: str = "triposr"  # registered generator that makes the starting field from the photo ("": none)
    generator: dict = dataclasses.field(default_factory=dict)  # its config (pretrained_model_name_or_path, dtype, ...)
    field_type: str = "triplane-nerf"  # registered field: the generator's (its sizes must match the generator's release)
    field: dict = dataclasses.field(default_factory=dict)  # its config
    material_type: str = "emission"  # color straight from the field, as the generator predicts it
    background_type: str = "solid-color"  # registered background
    guidance_type: str = ""  # "" : no refinement (the generated field as is); zero123 or analytic: refine by distillation


@register("generated-nerf")
class GeneratedNeRFSystem(ImageNeRFSystem):
    """A NeRF from one photo by a feed-forward generator, then optionally the image-NeRF recipe from it."""

    Config = GeneratedNeRFConfig

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.cfg.generator_type and not self.cfg.geometry_convert_from:
            self.start_from_generator()
        if self.cfg.guidance_type:
            super().setup(stage)
        elif stage == "fit" and self._trainer is not None:
            self.apply_matmul_precision(self.trainer.strategy.root_device)

    @torch.no_grad()
    def start_from_generator(self) -> None:
        """Run the generator on the reference photo and copy the field it predicts into ``self.field``."""
        reference = self.reference()
        if reference is None:
            raise ValueError(f"{self.registered_name} needs a photo: use data_type: single-image (data.image=PHOTO)")
        generator = self.build_part(self.cfg.generator_type, self.cfg.generator)
        device = self.trainer.strategy.root_device if self._trainer is not None else self.device
        generated = generator.load(device).generate(reference.rgba.to(device))
        del generator  # its weights (gigabytes for TripoSR) are not needed again
        if device.type == "cuda":
            torch.cuda.empty_cache()  # hand them back for a refinement stage in this process (Zero123)
        if generated.field_type != self.cfg.field_type:
            raise ConfigError(f"the generator {self.cfg.generator_type} makes a {generated.field_type} field, but "
                              f"system.field_type is {self.cfg.field_type}: set system.field_type={generated.field_type}")
        differing = {k: v for k, v in generated.field_config.items() if getattr(self.field.cfg, k) != v}
        if differing:
            settings = " ".join(f"system.field.{k}={v}" for k, v in differing.items())
            raise ConfigError(f"the field of {self.cfg.generator_type} differs from system.field: set {settings}")
        self.field.load_state_dict({k: v.to(self.field.triplane.device) for k, v in generated.state.items()})
        log.info("the field starts from %s's prediction", self.cfg.generator_type)

    def convert_from(self, previous: Any, previous_cfg: Any) -> None:
        """Start from a previous run's field (a triposr run's generated one); a field of other settings is the user's
        config to fix, named setting by setting."""
        theirs = getattr(previous, "field", None)
        if theirs is not None and type(theirs) is type(self.field) and theirs.cfg != self.field.cfg:
            differing = " ".join(f"system.field.{k}={v}" for k, v in vars(theirs.cfg).items() if getattr(self.field.cfg, k) != v)
            raise ConfigError(f"system.geometry_convert_from: that run's field has other settings; set {differing}")
        super().convert_from(previous, previous_cfg)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor | None:
        if self.cfg.guidance_type:
            return super().training_step(batch, batch_idx)
        # no refinement: one step whose loss has zero gradient, so the generated field is checkpointed unchanged
        return sum(p.sum() for p in self.field.parameters()) * 0.0
