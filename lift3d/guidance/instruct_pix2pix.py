"""``instruct-pix2pix``: the InstructPix2Pix editor (Brooks et al. 2023) from diffusers parts, used the way
Instruct-NeRF2NeRF uses it to re-edit a training view from the scene's current render.

The UNet takes 8 input channels (noisy latents + the conditioning image's latents) and a CLIP text context.
An edit encodes the render, noises it to a random timestep in [min, max] step percent, and denoises it
with a few DDIM steps under 3-way classifier-free guidance conditioned on the ORIGINAL photo's latents:

    eps = eps(x, 0, "") + s_T (eps(x, photo, text) - eps(x, photo, "")) + s_I (eps(x, photo, "") - eps(x, 0, ""))

Defaults are Instruct-NeRF2NeRF's: text scale 7.5 and image scale 1.5 (its README's command), 20 diffusion
steps, t in [0.02, 0.98] of the schedule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import ConfigError, bounded, choice
from lift3d.guidance.editing import Editor, EditorConfig
from lift3d.guidance.loading import (
    DTYPES,
    DiffusionModels,
    ModelLoadError,
    TextEncoder,
    frozen,
    hub_offline,
    load_part,
    model_key,
    resolve_dtype,
)
from lift3d.guidance.placement import LazyPlacement, runtime_dtype
from lift3d.guidance.score import per_sample, predict_x0, to_epsilon
from lift3d.registry import register

log = logging.getLogger(__name__)
CONFIG_KEY = "system.editor.pretrained_model_name_or_path"
UNET_CHANNELS = 8  # noisy latents (4) + conditioning image latents (4)


# ------------------------------------------------------------------------------------------ pure math
def instruct_guidance(eps_text: Tensor, eps_image: Tensor, eps_uncond: Tensor, text_scale: float, image_scale: float) -> Tensor:
    """InstructPix2Pix's 3-way classifier-free guidance: eps_text (photo + instruction), eps_image (photo, empty
    prompt), eps_uncond (no photo, empty prompt)."""
    return eps_uncond + text_scale * (eps_text - eps_image) + image_scale * (eps_image - eps_uncond)


def edit_timesteps(t_start: int, steps: int) -> list[int]:
    """At most ``steps`` DDIM timesteps from ``t_start`` down, evenly spaced: t_k = round(t_start (steps - k) / steps)
    (repeats dropped when t_start < steps); the step after the last one lands on the clean image."""
    return list(dict.fromkeys(int(round(t_start * (steps - k) / steps)) for k in range(steps)))


def ddim_step(x_t: Tensor, eps: Tensor, alpha_bar: Tensor, alpha_bar_prev: Tensor) -> Tensor:
    """Deterministic DDIM (eta = 0): x_prev = sqrt(a_prev) x0_hat + sqrt(1 - a_prev) eps; alpha bars [B]."""
    x0 = predict_x0(x_t, eps, alpha_bar)
    a_prev = per_sample(alpha_bar_prev, x_t)
    return a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps


def edit_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """The size an image is edited at: scaled so its longest side is at most ``max_side`` (0: no limit), then
    each side rounded down to a multiple of 8 (the VAE's factor), at least 8."""
    scale = min(1.0, max_side / max(height, width)) if max_side > 0 else 1.0
    return max(8, int(height * scale) // 8 * 8), max(8, int(width * scale) // 8 * 8)


# ------------------------------------------------------------------------------------------ loading
def load_instruct_pix2pix(name: str, dtype: torch.dtype, variant: str | None = None,
                          local_files_only: bool = False) -> DiffusionModels:
    """UNet (8 input channels), VAE, noise schedule and text encoder factory of an InstructPix2Pix folder or hub
    id, frozen, on the CPU in ``dtype``; errors as for the Stable Diffusion guidance, naming the editor's key."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel

    local_only = local_files_only or hub_offline()
    weights = {"torch_dtype": dtype, **({"variant": variant} if variant else {})}
    scheduler = load_part(DDPMScheduler.from_pretrained, name, "scheduler", local_only, config_key=CONFIG_KEY)
    unet = frozen(load_part(UNet2DConditionModel.from_pretrained, name, "unet", local_only, config_key=CONFIG_KEY, **weights))
    if unet.config.in_channels != UNET_CHANNELS:
        raise ModelLoadError(f"'{name}' is not an InstructPix2Pix model: its UNet takes {unet.config.in_channels} input "
                             f"channels, InstructPix2Pix's takes {UNET_CHANNELS} (noisy latents + image latents); set "
                             f"{CONFIG_KEY} to an InstructPix2Pix folder such as timbrooks/instruct-pix2pix")
    vae = frozen(load_part(AutoencoderKL.from_pretrained, name, "vae", local_only, config_key=CONFIG_KEY, **weights))

    def text_encoder(device: torch.device, dtype: torch.dtype) -> TextEncoder:
        from transformers import CLIPTextModel, CLIPTokenizer

        tokenizer = load_part(CLIPTokenizer.from_pretrained, name, "tokenizer", local_only, config_key=CONFIG_KEY)
        model = load_part(CLIPTextModel.from_pretrained, name, "text_encoder", local_only, config_key=CONFIG_KEY,
                          **({"variant": variant} if variant else {}))
        return TextEncoder(tokenizer, frozen(model).to(device=device, dtype=dtype))

    return DiffusionModels.with_schedule(unet, vae, scheduler, text_encoder, model_key(name))


# ------------------------------------------------------------------------------------------ the editor
@dataclass
class InstructPix2PixConfig(EditorConfig):
    pretrained_model_name_or_path: str = "timbrooks/instruct-pix2pix"  # hub id or local diffusers folder
    variant: str = ""  # weights variant to load, e.g. fp16 ("" = the default files)
    local_files_only: bool = False  # never contact the Hub (HF_HUB_OFFLINE=1 does the same)
    dtype: str = choice("auto", among=("auto", *DTYPES))  # auto (fp16 on GPU, fp32 on CPU), fp32, fp16, bf16
    guidance_scale: float = bounded(7.5, low=0)  # text guidance scale s_T (how strongly the instruction is followed)
    image_guidance_scale: float = bounded(1.5, low=0)  # image guidance scale s_I (how closely the edit keeps to the photo)
    diffusion_steps: int = bounded(20, low=1)  # DDIM steps from the noised render down to a clean image
    # lowest noise level an edit starts from, as a fraction of the schedule
    min_step_percent: float = bounded(0.02, low=0, high=1)
    max_step_percent: float = bounded(0.98, low=0, high=1)  # highest noise level an edit starts from
    # views larger than this (longest side) are edited at this size and resized back (0: no limit)
    max_side: int = bounded(512, low=0)


@register("instruct-pix2pix")
class InstructPix2PixEditor(LazyPlacement, Editor):
    """Edits renders with InstructPix2Pix, conditioned on the original photos (models loaded on construction)."""

    Config = InstructPix2PixConfig

    def __init__(self, cfg: Any = None, models: DiffusionModels | None = None) -> None:
        super().__init__(cfg)
        c = self.cfg
        if c.min_step_percent > c.max_step_percent:
            raise ConfigError(f"system.editor.min_step_percent must be at most max_step_percent ({c.max_step_percent}), got "
                              f"{c.min_step_percent}: e.g. system.editor.min_step_percent=0.02")
        self.dtype = resolve_dtype(c.dtype, torch.cuda.is_available())
        self.models = models or load_instruct_pix2pix(c.pretrained_model_name_or_path, self.dtype, c.variant or None,
                                                      c.local_files_only)  # a plain dataclass: in no state dict
        self.alphas_cumprod = self.models.alphas_cumprod.float()
        self.execution_device = torch.device("cpu")
        self._placed: torch.device | None = None
        self._context: Tensor | None = None  # [3, L, D]: instruction, empty, empty (computed once, encoder freed)

    def _ready(self) -> None:
        device = self.execution_device
        if self._placed == device:
            return
        self.dtype = runtime_dtype(self.dtype, self.cfg.dtype, device)
        for module in (self.models.unet, self.models.vae):
            module.to(device=device, dtype=self.dtype)
        self.alphas_cumprod = self.alphas_cumprod.to(device)
        if self._context is not None:
            self._context = self._context.to(device)
        self._placed = device

    def text_context(self) -> Tensor:
        """[3, L, D] text contexts for the three guidance branches: the instruction, then the empty prompt twice."""
        if self._context is None:
            if self.models.text_encoder is None:
                raise ModelLoadError("the InstructPix2Pix editor has no text encoder to embed the instruction")
            encoder = self.models.text_encoder(self.execution_device, self.dtype)
            embedded = encoder([self.cfg.prompt, ""])
            del encoder  # used once per run: release it
            self._context = torch.stack([embedded[0], embedded[1], embedded[1]]).to(self.execution_device)
        return self._context

    # ------------------------------------------------------------------ the model calls
    def encode(self, images: Tensor) -> Tensor:
        """Images [B, 3, h, w] in 0..1 -> scaled latents (posterior mean) [B, 4, h/8, w/8]."""
        posterior = self.models.vae.encode((images * 2 - 1).to(self.dtype), return_dict=False)[0]
        return posterior.mean * self.models.vae.config.scaling_factor

    def image_latents(self, images: Tensor) -> Tensor:
        """The conditioning image's latents [B, 4, h/8, w/8]: the posterior mode, unscaled (InstructPix2Pix's input)."""
        return self.models.vae.encode((images * 2 - 1).to(self.dtype), return_dict=False)[0].mode()

    def decode(self, latents: Tensor) -> Tensor:
        image = self.models.vae.decode((latents / self.models.vae.config.scaling_factor).to(self.dtype), return_dict=False)[0]
        return (image.float() * 0.5 + 0.5).clamp(0, 1)

    def guided_noise(self, x_t: Tensor, t: int, image_latents: Tensor, context: Tensor | None = None) -> Tensor:
        """The guided noise estimate [B, 4, h, w] at timestep ``t``: one UNet call on the three branches stacked
        (photo + instruction, photo + empty prompt, no photo + empty prompt)."""
        self._ready()
        context = self.text_context() if context is None else context
        b = x_t.shape[0]
        latents = torch.cat([x_t] * 3)
        images = torch.cat([image_latents, image_latents, torch.zeros_like(image_latents)])
        texts = context.repeat_interleave(b, dim=0).to(self.dtype)
        timestep = torch.full((3 * b,), t, device=x_t.device, dtype=torch.long)
        inputs = torch.cat([latents.to(self.dtype), images.to(self.dtype)], dim=1)
        out = self.models.unet(inputs, timestep, encoder_hidden_states=texts, return_dict=False)[0].float()
        alpha = self.alphas_cumprod[timestep]
        eps_text, eps_image, eps_uncond = to_epsilon(out, latents.float(), alpha, self.models.prediction_type).chunk(3)
        return instruct_guidance(eps_text, eps_image, eps_uncond, self.cfg.guidance_scale, self.cfg.image_guidance_scale)

    def start_timestep(self, generator: torch.Generator | None) -> int:
        """t ~ U{min..max} step percent of the schedule (as Instruct-NeRF2NeRF draws it)."""
        steps = len(self.alphas_cumprod)
        low, high = int(steps * self.cfg.min_step_percent), min(int(steps * self.cfg.max_step_percent), steps - 1)
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    @torch.no_grad()
    def edit(self, render: Tensor, photo: Tensor, generator: torch.Generator | None = None, timestep: int | None = None,
             noise: Tensor | None = None) -> Tensor:
        """Edit renders [B, H, W, 3] conditioned on the photos [B, H, W, 3]; returns [B, H, W, 3] in 0..1 at the
        render's size. ``timestep`` and ``noise`` (latent-shaped) fix the random draws (tests)."""
        self._ready()
        device = self.execution_device
        height, width = render.shape[1:3]
        size = edit_size(height, width, self.cfg.max_side)
        with torch.autocast(device.type, enabled=False):
            image, cond = (F.interpolate(x.permute(0, 3, 1, 2).float().to(device).clamp(0, 1), size, mode="bilinear",
                                         align_corners=False) for x in (render, photo))
            latents = self.encode(image).float()
            image_latents = self.image_latents(cond)
            t_start = self.start_timestep(generator) if timestep is None else int(timestep)
            if noise is None:
                noise = torch.randn(latents.shape, generator=generator).to(device)
            a0 = self.alphas_cumprod[t_start]
            x = a0.sqrt() * latents + (1 - a0).sqrt() * noise.to(device=device, dtype=latents.dtype)
            times = edit_timesteps(t_start, self.cfg.diffusion_steps)
            for k, t in enumerate(times):
                eps = self.guided_noise(x, t, image_latents)
                alpha = self.alphas_cumprod[t].expand(x.shape[0])
                last = k + 1 == len(times)
                alpha_prev = torch.ones_like(alpha) if last else self.alphas_cumprod[times[k + 1]].expand(x.shape[0])
                x = ddim_step(x, eps, alpha, alpha_prev)
            edited = self.decode(x)
            if tuple(edited.shape[-2:]) != (height, width):
                edited = F.interpolate(edited, (height, width), mode="bilinear", align_corners=False)
        return edited.permute(0, 2, 3, 1).clamp(0, 1)
