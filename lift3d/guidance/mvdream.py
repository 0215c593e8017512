"""MVDream guidance: score distillation from a multi-view diffusion model that denoises the 4 views of one
object together (cross-view self-attention, camera-conditioned), which largely removes the multi-face
("Janus") failure of single-view SDS.

The model is a diffusers-format folder (``unet/``, ``vae/``, ``text_encoder/``, ``tokenizer/``,
``scheduler/``) whose UNet is Stable Diffusion 2.1's with ``class_embed_type="projection"`` and
``projection_class_embeddings_input_dim=16``: MVDream's camera MLP on the flattened camera matrix
(``lift3d.guidance.multiview``). Loading installs the multi-view self-attention processor. Each step:

    consecutive groups of ``n_views`` renders are one object; one timestep per object;
    eps_hat = CFG(uncond, cond) over [uncond, cond] x views, each with its camera;
    x0_hat rescaled towards the conditional x0's std per object (``guidance_rescale``, MVDream's
    recon_std_rescale); grad = w(t) (eps_hat - eps), with w(t) = sqrt((1 - a) / a) by default
    (``weighting: recon``), which is exactly MVDream's x0-reconstruction loss 0.5 ||x - x0_hat||^2.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lift3d.config import bounded
from lift3d.guidance.latent import LatentDiffusionConfig, LatentDiffusionGuidance
from lift3d.guidance.loading import CONFIG_KEY, DiffusionModels, ModelLoadError, load_stable_diffusion
from lift3d.guidance.multiview import (
    CAMERA_DIM,
    install_multiview_attention,
    mvdream_camera,
    per_object_timesteps,
    rescale_guidance,
    set_num_views,
)
from lift3d.guidance.prompts import PromptConfig, PromptProcessor
from lift3d.guidance.score import classifier_free_guidance, per_sample, predict_x0, to_epsilon
from lift3d.registry import register

log = logging.getLogger(__name__)

NEGATIVE_PROMPT = ("ugly, bad anatomy, blurry, pixelated obscure, unnatural colors, poor lighting, dull, and unclear, cropped, "
                   "lowres, low quality, artifacts, duplicate, morbid, mutilated, poorly drawn face, deformed, dehydrated, "
                   "bad proportions")  # threestudio's mvdream-sd21 recipe


def check_mvdream_unet(unet: Any, name: str) -> None:
    """Raise ``ModelLoadError`` unless ``unet`` has MVDream's camera embedding (a 16-input projection)."""
    config = unet.config
    if config.class_embed_type != "projection" or config.projection_class_embeddings_input_dim != CAMERA_DIM:
        raise ModelLoadError(
            f"'{name}' is not an MVDream model: its UNet has class_embed_type={config.class_embed_type!r} with "
            f"projection_class_embeddings_input_dim={config.projection_class_embeddings_input_dim}; MVDream's takes the "
            f"flattened 4x4 camera matrix (class_embed_type='projection', projection_class_embeddings_input_dim={CAMERA_DIM}). "
            "python -m lift3d.guidance.mvdream_convert makes such a folder from MVDream's released weights"
        )


def load_mvdream(name: str, dtype: torch.dtype, variant: str | None = None, local_files_only: bool = False,
                 n_views: int = 4) -> DiffusionModels:
    """Load an MVDream model (hub id or diffusers folder) as Stable Diffusion's parts, check its camera
    embedding, and install the multi-view self-attention processor on its UNet."""
    models = load_stable_diffusion(name, dtype, variant, local_files_only)
    check_mvdream_unet(models.unet, name)
    install_multiview_attention(models.unet, n_views)
    return models


@dataclass
class MVDreamConfig(LatentDiffusionConfig, PromptConfig):
    """SDS from an MVDream model (threestudio's mvdream-sd21 defaults)."""

    pretrained_model_name_or_path: str = ""  # diffusers folder (or hub id) of an MVDream model (16-input camera projection)
    n_views: int = bounded(4, low=1)  # views of one object denoised together (consecutive renders of a batch; MVDream: 4)
    resolution: int = 256  # MVDream works at 256x256 (32x32 latents)
    guidance_scale: float = 50.0  # CFG scale (threestudio's mvdream-sd21)
    # rescale the CFG x0 estimate towards the conditional one's std per object (0: off)
    guidance_rescale: float = bounded(0.5, low=0, high=1)
    weighting: str = "recon"  # w(t): recon sqrt((1-a)/a) (MVDream's x0-reconstruction loss), sds, uniform, fantasia3d
    negative_prompt: str = NEGATIVE_PROMPT  # the unconditional text
    view_dependent_prompting: bool = False  # the camera embedding says the view; no ", front view" suffixes


@register("mvdream")
class MVDreamGuidance(LatentDiffusionGuidance):
    """Multi-view SDS; ``models`` (tests, benchmarks) replaces loading from ``pretrained_model_name_or_path``."""

    Config = MVDreamConfig

    def __init__(self, cfg: Any = None, models: DiffusionModels | None = None) -> None:
        super().__init__(cfg, models)
        cfg = self.cfg
        if cfg.perp_neg:
            raise ValueError("guidance.perp_neg is for single-view Stable Diffusion; MVDream's camera embedding sets the view")
        check_mvdream_unet(self.unet, cfg.pretrained_model_name_or_path)
        # the attention options (configure_attention) replaced the processors: wrap the chosen ones across views
        install_multiview_attention(self.unet, cfg.n_views)
        self.prompts = PromptProcessor(cfg, self.models.model_key, self.models.text_encoder)
        self._views: int | None = None

    def load_models(self) -> DiffusionModels:
        cfg = self.cfg
        if not cfg.pretrained_model_name_or_path:
            raise ModelLoadError(f"{CONFIG_KEY} is empty: point it at an MVDream model in diffusers "
                                 "layout (unet/ with a 16-input camera projection, vae/, text_encoder/, tokenizer/, scheduler/); "
                                 "python -m lift3d.guidance.mvdream_convert makes one from MVDream's sd-v2.1-base-4view.pt")
        return load_mvdream(cfg.pretrained_model_name_or_path, self.dtype, cfg.variant or None, cfg.local_files_only, cfg.n_views)

    # ------------------------------------------------------------------ views per object
    def views_per_object(self, n: int) -> int:
        """``n_views`` when the batch holds whole objects; else 1 (evaluation panels of single views)."""
        return self.cfg.n_views if n % self.cfg.n_views == 0 else 1

    def sample_timesteps(self, n: int, device: torch.device) -> Tensor:
        """One timestep per object, shared by its views (as MVDream is trained and sampled)."""
        return per_object_timesteps(super().sample_timesteps, n, self.cfg.n_views, device, "mvdream")

    def camera_conditioning(self, batch: dict[str, Any], n: int) -> Tensor:
        """MVDream's camera vectors [n, 16] of the batch's views."""
        if "cameras" not in batch:
            raise KeyError("the mvdream guidance needs the views' 'cameras' in the batch")
        c2w = batch["cameras"].c2w
        if c2w.shape[0] != n:
            raise ValueError(f"the batch has {c2w.shape[0]} cameras for {n} renders")
        return mvdream_camera(c2w.to(self.execution_device))

    # ------------------------------------------------------------------ the guided estimate
    def predict_noise(self, x_t: Tensor, t: Tensor, batch: dict[str, Any]) -> Tensor:
        n = x_t.shape[0]
        views = self.views_per_object(n)
        if views != self._views:
            set_num_views(self.unet, views)
            self._views = views
        prompts = self.prompts(batch, n, self.execution_device, self.dtype)
        camera = self.camera_conditioning(batch, n).to(self.dtype)
        context = torch.cat([prompts.uncond, prompts.cond])
        x_in, t_in = x_t.repeat(2, 1, 1, 1), t.repeat(2)
        out = self.unet_forward(x_in, t_in, context, class_labels=camera.repeat(2, 1)).float()
        eps = to_epsilon(out, x_in, self.alphas_cumprod[t_in], self.prediction_type).reshape(2, *x_t.shape)
        guided = classifier_free_guidance(eps[0], eps[1], self.cfg.guidance_scale)
        return rescaled_epsilon(x_t, guided, eps[1], self.alphas_cumprod[t], self.cfg.guidance_rescale, views)


def rescaled_epsilon(x_t: Tensor, guided: Tensor, cond: Tensor, alpha_bar: Tensor, rescale: float, views: int) -> Tensor:
    """The guided noise estimate whose x0 estimate is rescaled towards the conditional one's std over each
    object's ``views`` (MVDream's recon_std_rescale), returned as noise: eps = (x_t - sqrt(a) x0) / sqrt(1 - a)."""
    if rescale == 0:
        return guided
    x0 = rescale_guidance(predict_x0(x_t, guided, alpha_bar), predict_x0(x_t, cond, alpha_bar), rescale, views)
    a = per_sample(alpha_bar, x_t)
    return (x_t - a.sqrt() * x0) / (1 - a).sqrt()
