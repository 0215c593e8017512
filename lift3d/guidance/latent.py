"""The machinery every latent-diffusion guidance shares: frozen UNet + VAE placed on a device in the
guidance's dtype, speed options (channels-last, compile, CUDA graphs, offload), VAE encode/decode of
renders, and the UNet call with the trainer's autocast off.

Subclasses (``stable-diffusion``, ``stable-diffusion-vsd``, ``zero123``) load their models, hand them over
as ``self.models`` (anything with ``unet``, ``vae``, ``alphas_cumprod`` and ``prediction_type``) and say
how the UNet is conditioned (``predict_noise``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import bounded, choice
from lift3d.guidance.base import DistillationConfig, DistillationGuidance
from lift3d.guidance.loading import DTYPES, resolve_dtype
from lift3d.guidance.options import (
    GraphedForward,
    ModelOffload,
    ModelOptionsConfig,
    check_options,
    compile_fn,
    configure_attention,
    set_memory_format,
)
from lift3d.guidance.placement import LazyPlacement, runtime_dtype

log = logging.getLogger(__name__)


@dataclass
class LatentDiffusionConfig(DistillationConfig, ModelOptionsConfig):
    """A latent diffusion model (hub id or local diffusers folder) and how renders reach it."""

    pretrained_model_name_or_path: str = ""  # hub id or local diffusers folder
    variant: str = ""  # weights variant to load, e.g. fp16 ("" = the default files)
    local_files_only: bool = False  # never contact the Hub (HF_HUB_OFFLINE=1 does the same)
    dtype: str = choice("auto", among=("auto", *DTYPES))  # auto (fp16 on GPU, fp32 on CPU), fp32, fp16, bf16
    resolution: int = bounded(512, low=8, multiple_of=8)  # renders are resized (bilinear) to this square size before the VAE
    latent_input: bool = False  # take renders as [B,h,w,4] latents directly (no VAE), as Latent-NeRF


class LatentDiffusionGuidance(LazyPlacement, DistillationGuidance):
    """Distillation through a frozen latent diffusion model; subclasses load ``models`` and condition it."""

    Config = LatentDiffusionConfig
    graph_capture_safe = True  # the UNet's control flow is the same on every call (cuda_graphs may capture it eagerly)

    def __init__(self, cfg: Any = None, models: Any = None) -> None:
        super().__init__(cfg)
        cfg = self.cfg
        check_options(cfg)
        self.dtype = resolve_dtype(cfg.dtype, torch.cuda.is_available())
        if models is None:
            models = self.load_models()
        self.models = models  # a plain dataclass: not registered, so not in any state dict
        self.prediction_type = models.prediction_type
        self.set_noise_schedule(models.alphas_cumprod)
        configure_attention(models.unet, models.vae, cfg)
        self.offload = ModelOffload(models.unet, cfg.cpu_offload)
        self.execution_device = torch.device("cpu")
        self._placed: torch.device | None = None
        self._unet_fn: Any = None
        self._encode_fn: Any = None
        self._cuda_graphs = False  # compiled with CUDA graphs: mark each step, copy outputs
        self._graphed = False  # the eager UNet forward captured as CUDA graphs (cuda_graphs without compile): copy outputs
        self.latent_input = cfg.latent_input  # systems may switch it per step (a latent warm-up, then RGB)

    def load_models(self) -> Any:
        """The frozen models of ``pretrained_model_name_or_path`` (each guidance loads its own kind)."""
        raise NotImplementedError

    def extra_modules(self) -> list[torch.nn.Module]:
        """Frozen modules besides UNet and VAE that must follow the guidance to its device."""
        return []

    # ------------------------------------------------------------------ placement and speed options
    @property
    def unet(self) -> torch.nn.Module:
        return self.models.unet

    @property
    def vae(self) -> torch.nn.Module:
        return self.models.vae

    def _ready(self) -> None:
        """Place the models on the execution device and set up speed options, once per device."""
        device = self.execution_device
        if self._placed == device:
            return
        cuda = device.type == "cuda"
        dtype = runtime_dtype(self.dtype, self.cfg.dtype, device)
        if dtype != self.dtype:
            log.info("the guidance runs on %s: using fp32 weights", device)
            self.dtype = dtype
        modules = [m for m in (self.unet, self.vae) if m is not None]  # no VAE: a pixel-space model (DeepFloyd IF)
        for module in modules + self.extra_modules():
            if next(module.parameters()).dtype != self.dtype:
                module.to(dtype=self.dtype)
        set_memory_format(modules, self.cfg.channels_last)
        self.offload.place(device)
        if self.vae is not None:
            self.vae.to(device)
        for module in self.extra_modules():
            module.to(device)
        if cuda and self.cfg.cudnn_benchmark:
            torch.backends.cudnn.benchmark = True
        unet_fn, encode_fn = self.unet, self._encode_images
        self._cuda_graphs = bool(self.cfg.compile and self.cfg.cuda_graphs and cuda)
        self._graphed = bool(self.cfg.cuda_graphs and not self.cfg.compile and cuda and not self.offload.active)
        if self._graphed and not self.graph_capture_safe:
            log.info("guidance.cuda_graphs without compile does not apply to %s (its UNet changes between calls); "
                     "running it eagerly", type(self).__name__)
            self._graphed = False
        if self.cfg.compile and cuda:
            unet_fn = compile_fn(self.unet, self.cfg)
            if self.cfg.compile_vae:
                encode_fn = compile_fn(self._encode_images, self.cfg)
        elif self.cfg.compile:
            log.info("guidance.compile needs CUDA; running the UNet eagerly on %s", device)
        elif self._graphed:
            unet_fn = GraphedForward(self.unet)
        # plain attributes, not child modules: the UNet is registered once (as .unet), and a compile fallback
        # wrapper is a callable, not an nn.Module
        object.__setattr__(self, "_unet_fn", unet_fn)
        object.__setattr__(self, "_encode_fn", encode_fn)
        self._placed = device

    def unet_forward(self, x: Tensor, t: Tensor, context: Tensor, class_labels: Tensor | None = None) -> Tensor:
        """The UNet's raw output [N,4,h,w] for latents x [N,4,h,w], timesteps t [N], text context [N,L,D]."""
        self._ready()
        x = x.to(self.dtype)
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with self.offload:
            out = self._unet_fn(x, t, encoder_hidden_states=context.to(self.dtype), class_labels=class_labels,
                                return_dict=False)[0]
        return out.clone() if self._cuda_graphs or self._graphed else out  # CUDA-graph outputs are overwritten by the next replay

    def forward(self, rgb: Tensor, batch: dict[str, Any], return_images: bool = False, timesteps: Tensor | None = None,
                noise: Tensor | None = None) -> dict[str, Any]:
        """The distillation step with the caller's autocast off: the frozen models run in the guidance's own
        dtype whatever the trainer's precision (16-mixed, bf16-mixed and 32-true give the same compiled graphs)."""
        with torch.autocast(self.execution_device.type, enabled=False):
            return super().forward(rgb, batch, return_images, timesteps, noise)

    # ------------------------------------------------------------------ encode / decode
    def _encode_images(self, image: Tensor) -> Tensor:
        """Images [B,3,R,R] in 0..1 -> scaled latents [B,4,R/8,R/8] (the posterior mean: deterministic)."""
        image = (image * 2 - 1).to(self.dtype)
        if self.cfg.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        posterior = self.vae.encode(image, return_dict=False)[0]
        return posterior.mean * self.vae.config.scaling_factor

    def encode(self, rgb: Tensor) -> Tensor:
        self._ready()
        if self._cuda_graphs:  # encode starts every step: a new CUDA-graph generation
            torch.compiler.cudagraph_mark_step_begin()
        size = self.cfg.resolution
        if self.latent_input:
            if rgb.shape[-1] != 4:
                raise ValueError(f"guidance.latent_input expects [B,h,w,4] latents, got {tuple(rgb.shape)}")
            latents = rgb.permute(0, 3, 1, 2)
            if latents.shape[-1] != size // 8 or latents.shape[-2] != size // 8:
                latents = F.interpolate(latents, (size // 8, size // 8), mode="bilinear", align_corners=False)
            return latents
        if rgb.shape[-1] != 3:
            raise ValueError("the guidance expects [B,H,W,3] renders in 0..1 (or set guidance.latent_input=true), "
                             f"got {tuple(rgb.shape)}")
        image = rgb.permute(0, 3, 1, 2).to(self.execution_device)
        if image.shape[-2:] != (size, size):
            image = F.interpolate(image, (size, size), mode="bilinear", align_corners=False)
        return self._encode_fn(image)

    def decode(self, x: Tensor) -> Tensor:
        image = self.vae.decode((x / self.vae.config.scaling_factor).to(self.dtype), return_dict=False)[0]
        return (image.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
