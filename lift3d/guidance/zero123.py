"""Zero123 guidance: score distillation from a novel-view diffusion model conditioned on one reference image
and the camera of the rendered view relative to it (Zero-1-to-3, Zero123-XL, Stable Zero123).

The model is Stable Diffusion's UNet with an 8-channel input (noisy latents + the reference image's VAE
latents) whose cross-attention context is one token: ``cc_projection([CLIP image embedding, camera])``.
Classifier-free guidance contrasts it with the unconditional branch (zero context, zero reference
latents). The reference's CLIP embedding and latents are computed once (``set_reference``) and cached.

Camera 4-vectors (angles of the rendered view minus those of the reference, degrees in, radians out):
* ``zero123``: [-d_elevation, sin(d_azimuth), cos(d_azimuth), d_distance] (Zero123 and Zero123-XL: the
  first entry is the change of polar angle, polar = 90 - elevation);
* ``stable-zero123``: [-d_elevation, sin(d_azimuth), cos(d_azimuth), 90 - reference elevation], the
  reference's own polar angle in the last slot (Stable Zero123 is trained with it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import choice
from lift3d.guidance.latent import LatentDiffusionConfig, LatentDiffusionGuidance
from lift3d.guidance.loading import frozen, hub_offline, load_part, model_key
from lift3d.guidance.score import classifier_free_guidance, to_epsilon
from lift3d.registry import register

CAMERA_EMBEDDINGS = ("zero123", "stable-zero123")
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's image normalization
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def relative_camera(elevation_deg: Tensor, azimuth_deg: Tensor, distance: Tensor, reference: tuple[float, float, float],
                    kind: str = "zero123") -> Tensor:
    """The camera conditioning [B, 4] of views at (elevation, azimuth, distance) [B] seen from the reference
    view ``(elevation_deg, azimuth_deg, distance)`` (see the module docstring)."""
    ref_elevation, ref_azimuth, ref_distance = reference
    d_elevation = torch.deg2rad(elevation_deg.float() - ref_elevation)
    d_azimuth = torch.deg2rad(azimuth_deg.float() - ref_azimuth)
    if kind == "zero123":
        last = distance.float() - ref_distance
    elif kind == "stable-zero123":
        last = torch.full_like(d_elevation, float(torch.deg2rad(torch.tensor(90.0 - ref_elevation))))
    else:
        raise ValueError(f"guidance.camera_embedding must be one of {', '.join(CAMERA_EMBEDDINGS)}, got {kind!r}")
    return torch.stack([-d_elevation, torch.sin(d_azimuth), torch.cos(d_azimuth), last], dim=-1)


@dataclass
class Zero123Models:
    """The frozen parts of a Zero123 model in diffusers layout."""

    unet: torch.nn.Module  # in_channels 8: noisy latents + reference latents
    vae: torch.nn.Module
    image_encoder: torch.nn.Module  # transformers CLIPVisionModelWithProjection
    cc_projection: torch.nn.Linear  # [CLIP embedding, camera 4-vector] -> the UNet's context token
    image_size: int  # CLIP input size (224 for ViT-L/14)
    alphas_cumprod: Tensor  # [T]
    prediction_type: str
    model_key: str


# what a local copy of a Zero123 model holds (named in the error when one cannot be loaded)
ZERO123_PARTS = "unet/, vae/, image_encoder/, cc_projection/ and scheduler/"


def load_cc_projection(name: str, local_only: bool) -> torch.nn.Linear:
    """The camera-projection layer (``cc_projection/``: config.json with in/out channels, weights as
    safetensors or a weights-only torch file), as a plain ``nn.Linear`` — no custom model class needed."""
    from huggingface_hub import hf_hub_download

    def fetch(filename: str, subfolder: str) -> str:
        folder = Path(name).expanduser()
        if folder.is_dir():
            path = folder / subfolder / filename
            if not path.is_file():
                raise FileNotFoundError(f"{path} does not exist")
            return str(path)
        return hf_hub_download(name, filename, subfolder=subfolder, local_files_only=local_only)

    def read(_: str, subfolder: str, local_files_only: bool) -> torch.nn.Linear:
        config = json.loads(Path(fetch("config.json", subfolder)).read_text())
        from safetensors.torch import load_file

        try:
            state = load_file(fetch("diffusion_pytorch_model.safetensors", subfolder))
        except Exception:  # noqa: BLE001  (absent locally or on the Hub: older conversions ship a .bin)
            state = torch.load(fetch("diffusion_pytorch_model.bin", subfolder), map_location="cpu", weights_only=True)
        state = {key.removeprefix("projection."): value for key, value in state.items()}
        layer = torch.nn.Linear(int(config["in_channel"]), int(config["out_channel"]))
        layer.load_state_dict(state)
        return layer

    return load_part(read, name, "cc_projection", local_only, ZERO123_PARTS)


def load_zero123(name: str, dtype: torch.dtype, variant: str | None = None, local_files_only: bool = False) -> Zero123Models:
    """Load UNet, VAE, CLIP image encoder, camera projection and scheduler of ``name`` (hub id or folder)."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPVisionModelWithProjection

    local_only = local_files_only or hub_offline()
    weights = {"torch_dtype": dtype, **({"variant": variant} if variant else {})}
    scheduler = load_part(DDPMScheduler.from_pretrained, name, "scheduler", local_only, ZERO123_PARTS)
    unet = frozen(load_part(UNet2DConditionModel.from_pretrained, name, "unet", local_only, ZERO123_PARTS, **weights))
    if unet.config.in_channels != 8:
        from lift3d.guidance.loading import ModelLoadError

        raise ModelLoadError(f"'{name}' is not a Zero123 model: its UNet takes {unet.config.in_channels} input channels, "
                             "Zero123's take 8 (noisy latents + the reference image's latents)")
    vae = frozen(load_part(AutoencoderKL.from_pretrained, name, "vae", local_only, ZERO123_PARTS, **weights))
    encoder = frozen(load_part(CLIPVisionModelWithProjection.from_pretrained, name, "image_encoder", local_only,
                                ZERO123_PARTS))
    projection = frozen(load_cc_projection(name, local_only))
    return Zero123Models(unet, vae, encoder, projection, int(encoder.config.image_size), scheduler.alphas_cumprod.float(),
                         str(scheduler.config.prediction_type), model_key(name))


@dataclass
class Zero123Config(LatentDiffusionConfig):
    """SDS from a Zero123-family model; the reference image and its camera come from the system."""

    pretrained_model_name_or_path: str = "ashawkey/zero123-xl-diffusers"  # hub id or local diffusers folder (Zero123 layout)
    # zero123 (Zero123, Zero123-XL) or stable-zero123 (Stable Zero123)
    camera_embedding: str = choice("zero123", among=CAMERA_EMBEDDINGS)
    resolution: int = 256  # Zero123 works at 256x256 (32x32 latents)
    guidance_scale: float = 3.0  # CFG scale over the image + camera condition (threestudio's default)


@register("zero123")
class Zero123Guidance(LatentDiffusionGuidance):
    """Novel-view SDS around one reference image; ``models`` (tests, benchmarks) replaces loading."""

    Config = Zero123Config

    def __init__(self, cfg: Any = None, models: Zero123Models | None = None) -> None:
        super().__init__(cfg, models)
        self.reference_camera: tuple[float, float, float] | None = None
        self._reference: tuple[Tensor, Tensor] | None = None  # (CLIP embedding [1, D], latents [1, 4, h, w])
        self._reference_device: torch.device | None = None  # where they were computed
        self._reference_rgb: Tensor | None = None

    def load_models(self) -> Zero123Models:
        cfg = self.cfg
        return load_zero123(cfg.pretrained_model_name_or_path, self.dtype, cfg.variant or None, cfg.local_files_only)

    def extra_modules(self) -> list[torch.nn.Module]:
        return [self.models.image_encoder, self.models.cc_projection]

    # ------------------------------------------------------------------ the reference view
    def set_reference(self, rgb: Tensor, elevation_deg: float, azimuth_deg: float, distance: float) -> None:
        """The reference image [H, W, 3] in 0..1 (composited on its background) and its camera; the
        conditioning is computed at the next step, once."""
        self._reference_rgb = rgb.detach().float().cpu()
        self.reference_camera = (float(elevation_deg), float(azimuth_deg), float(distance))
        self._reference = None

    @torch.no_grad()
    def reference_conditioning(self) -> tuple[Tensor, Tensor]:
        """(CLIP image embedding [1, D], reference latents [1, 4, h, w]), computed once per reference."""
        if self._reference is None or self._reference_device != self.execution_device:
            if self._reference_rgb is None:
                raise ValueError("the zero123 guidance has no reference image: the system must call set_reference first")
            self._ready()
            device = self.execution_device
            image = self._reference_rgb.permute(2, 0, 1)[None].to(device)
            size = self.models.image_size
            clip_in = F.interpolate(image, (size, size), mode="bicubic", align_corners=False, antialias=True).clamp(0, 1)
            mean, std = (torch.tensor(v, device=device)[:, None, None] for v in (CLIP_MEAN, CLIP_STD))
            clip_in = (clip_in - mean) / std
            embedding = self.models.image_encoder(clip_in.to(self.dtype)).image_embeds.float()
            resolution = self.cfg.resolution
            vae_in = F.interpolate(image, (resolution, resolution), mode="bilinear", align_corners=False, antialias=True)
            # Zero123 concatenates the posterior mode without the VAE's scaling factor
            latents = self.vae.encode((vae_in * 2 - 1).to(self.dtype), return_dict=False)[0].mode().float()
            self._reference = (embedding, latents)
            self._reference_device = self.execution_device  # ("cuda" is not equal to a tensor's "cuda:0")
        return self._reference

    def camera_conditioning(self, batch: dict[str, Any], n: int) -> Tensor:
        """[n, 4] for the batch's views relative to the reference (see ``relative_camera``)."""
        if self.reference_camera is None:
            raise ValueError("the zero123 guidance has no reference camera: the system must call set_reference first")
        if not all(key in batch for key in ("elevation_deg", "azimuth_deg", "distance")):
            raise KeyError("the zero123 guidance needs 'elevation_deg', 'azimuth_deg' and 'distance' in the batch")
        device = self.execution_device
        values = [torch.as_tensor(batch[key]).reshape(n).to(device) for key in ("elevation_deg", "azimuth_deg", "distance")]
        return relative_camera(*values, self.reference_camera, self.cfg.camera_embedding)

    # ------------------------------------------------------------------ the guided estimate
    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        n = x_t.shape[0]
        embedding, latents = self.reference_conditioning()
        camera = self.camera_conditioning(batch, n)
        projection = self.models.cc_projection
        token = projection(torch.cat([embedding.expand(n, -1), camera], dim=-1).to(projection.weight.dtype))[:, None]
        context = torch.cat([torch.zeros_like(token), token])
        concat = latents.expand(n, -1, -1, -1).to(x_t.dtype)
        x_in = torch.cat([torch.cat([x_t, torch.zeros_like(concat)], 1), torch.cat([x_t, concat], 1)])
        t_in = t.repeat(2)
        out = self.unet_forward(x_in, t_in, context).float()
        eps = to_epsilon(out, x_in[:, :4], self.alphas_cumprod[t_in], self.prediction_type).reshape(2, *x_t.shape)
        return classifier_free_guidance(eps[0], eps[1], self.cfg.guidance_scale)
