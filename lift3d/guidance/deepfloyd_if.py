"""Score distillation from DeepFloyd IF stage I (threestudio's ``dreamfusion-if`` / ``magic3d-if`` prior).

IF's first stage is a pixel-space diffusion model: renders are resized (bilinear) to 64x64 and mapped to
[-1, 1] — no VAE. Its UNet predicts noise and variance in one tensor ([N, 6, 64, 64]: diffusers' IFPipeline
takes the first 3 channels as the noise and the rest as the learned variance range), so SDS uses the first 3.
Text comes from T5-v1.1-XXL (4.7B parameters, 4096-wide embeddings of 77 tokens, as IFPipeline encodes
them): the prompt embeddings (plain, negative, per view) are cached on disk keyed by model, text and token
length, so the encoder is loaded once per prompt, used, and freed before the UNet reaches the GPU.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lift3d.config import bounded, choice, parse_structured
from lift3d.guidance.loading import (
    DTYPES,
    DiffusionModels,
    ModelLoadError,
    frozen,
    hub_offline,
    load_part,
    model_key,
    resolve_dtype,
)
from lift3d.guidance.sds import StableDiffusionConfig, StableDiffusionGuidance
from lift3d.registry import register

log = logging.getLogger(__name__)

IF_PARTS = "unet/, scheduler/, text_encoder/ and tokenizer/ (IF has no VAE)"
IF_MAX_LENGTH = 77  # IFPipeline's token length: T5 reads longer inputs, but IF was trained on 77


def epsilon_channels(out: Tensor, channels: int) -> Tensor:
    """The noise prediction [N, C, H, W] in a UNet output that may carry a learned variance after it ([N, 2C, H, W])."""
    if out.shape[1] == 2 * channels:
        return out[:, :channels]
    if out.shape[1] == channels:
        return out
    raise ValueError(f"the UNet returns {out.shape[1]} channels for {channels}-channel inputs "
                     f"(expected {channels} or {2 * channels})")


def pixel_input(rgb: Tensor, size: int) -> Tensor:
    """Renders [B, H, W, 3] in 0..1 -> the model's input [B, 3, size, size] in [-1, 1] (bilinear resize)."""
    image = rgb.permute(0, 3, 1, 2)
    if image.shape[-2:] != (size, size):
        image = F.interpolate(image, (size, size), mode="bilinear", align_corners=False)
    return image * 2 - 1


class T5TextEncoder:
    """Tokenizer + T5 encoder: texts -> per-token embeddings [N, max_length, D], padded and masked as IFPipeline does."""

    def __init__(self, tokenizer: Any, model: torch.nn.Module, max_length: int) -> None:
        self.tokenizer, self.model, self.max_length = tokenizer, model, max_length

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> Tensor:
        tokens = self.tokenizer(texts, padding="max_length", max_length=self.max_length, truncation=True,
                                add_special_tokens=True, return_tensors="pt")
        device = next(self.model.parameters()).device
        out = self.model(tokens.input_ids.to(device), attention_mask=tokens.attention_mask.to(device))[0]
        return out.float()


def resolve_text_encoder_dtype(name: str, device: torch.device) -> torch.dtype:
    """T5's dtype: ``auto`` is bf16 on a GPU (T5-v1.1 overflows fp16 in places; DeepFloyd's own T5Embedder runs it
    in bf16) and fp32 on the CPU; else fp32 / fp16 / bf16 (half types on the CPU fall back to fp32)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return resolve_dtype(name, device.type == "cuda")


def load_deepfloyd_if(name: str, dtype: torch.dtype, variant: str | None = None, local_files_only: bool = False,
                      max_length: int = IF_MAX_LENGTH, text_encoder_dtype: str = "auto") -> DiffusionModels:
    """Load the stage-I UNet and scheduler of ``name`` (hub id or folder) on the CPU in ``dtype``, frozen; the T5
    encoder is only a factory here (loaded when an embedding is missing from the cache, then released)."""
    from diffusers import DDPMScheduler, UNet2DConditionModel

    local_only = local_files_only or hub_offline()
    weights = {"torch_dtype": dtype, **({"variant": variant} if variant else {})}
    scheduler = load_part(DDPMScheduler.from_pretrained, name, "scheduler", local_only, IF_PARTS)
    unet = frozen(load_part(UNet2DConditionModel.from_pretrained, name, "unet", local_only, IF_PARTS, **weights))
    if unet.config.in_channels != 3:
        raise ModelLoadError(
            f"'{name}' is not a DeepFloyd IF stage I model: its UNet takes {unet.config.in_channels} input channels, IF "
            "stage I takes 3 (RGB pixels); use guidance_type=stable-diffusion for latent models, or DeepFloyd/IF-I-XL-v1.0"
        )

    def text_encoder(device: torch.device, _: torch.dtype) -> T5TextEncoder:
        from transformers import AutoTokenizer, T5EncoderModel

        t5_dtype = resolve_text_encoder_dtype(text_encoder_dtype, torch.device(device))
        try:
            tokenizer = load_part(AutoTokenizer.from_pretrained, name, "tokenizer", local_only, IF_PARTS)
        except ModelLoadError as error:
            if importlib.util.find_spec("sentencepiece") is None:  # IF ships tokenizer/spiece.model, no tokenizer.json
                raise ModelLoadError(f"{error} DeepFloyd IF's T5 tokenizer is a SentencePiece model (tokenizer/spiece.model), "
                                     "which needs sentencepiece: pip install sentencepiece "
                                     "(or pip install 'lift3d[deepfloyd]')") from error
            raise
        log.info("loading the T5 text encoder of %s to embed the prompts (cached afterwards)", name)
        model = load_part(T5EncoderModel.from_pretrained, name, "text_encoder", local_only, IF_PARTS, torch_dtype=t5_dtype,
                          **({"variant": variant} if variant else {}))
        return T5TextEncoder(tokenizer, frozen(model).to(device=device), max_length)

    return DiffusionModels.with_schedule(unet, None, scheduler, text_encoder, if_model_key(name, max_length))


def if_model_key(name: str, max_length: int) -> str:
    """The prompt-cache key of a model: T5 embeddings depend on the token length as well as the text."""
    return f"{model_key(name)}#t5-max-length={max_length}"


@dataclass
class DeepFloydIFConfig(StableDiffusionConfig):
    """SDS from DeepFloyd IF stage I (hub id or local diffusers folder); the VAE options have no effect (no VAE)."""

    pretrained_model_name_or_path: str = "DeepFloyd/IF-I-XL-v1.0"  # hub id or local diffusers folder of IF stage I
    resolution: int = 64  # renders are resized (bilinear) to this square size: IF stage I works at 64x64
    guidance_scale: float = 20.0  # classifier-free guidance scale (threestudio's dreamfusion-if uses 20)
    text_max_length: int = bounded(IF_MAX_LENGTH, low=1)  # T5 tokens per prompt (IF was trained on 77); part of the cache key
    # T5's dtype: auto (bf16 on GPU, fp32 on CPU), fp32, fp16, bf16
    text_encoder_dtype: str = choice("auto", among=("auto", *DTYPES))


def check_config(c: DeepFloydIFConfig) -> None:
    """Reject options that cannot apply to a pixel-space model, naming the fix."""
    if c.latent_input:
        raise ValueError("DeepFloyd IF works on RGB pixels: guidance.latent_input (and system.latent_steps) "
                         "need stable-diffusion")
    if c.fuse_qkv:
        raise ValueError("guidance.fuse_qkv does not apply to DeepFloyd IF (its attention has added text key/value projections)")


@register("deepfloyd-if")
class DeepFloydIFGuidance(StableDiffusionGuidance):
    """SDS in IF's 64x64 pixel space; ``models`` (tests, benchmarks) replaces loading from ``pretrained_model_name_or_path``."""

    Config = DeepFloydIFConfig

    def __init__(self, cfg: Any = None, models: DiffusionModels | None = None) -> None:
        check_config(parse_structured(self.Config, cfg, path="deepfloyd-if"))  # before gigabytes of weights load
        super().__init__(cfg, models)

    def load_models(self) -> DiffusionModels:
        c = self.cfg
        return load_deepfloyd_if(c.pretrained_model_name_or_path, self.dtype, c.variant or None, c.local_files_only,
                                 c.text_max_length, c.text_encoder_dtype)

    # ------------------------------------------------------------------ text embeddings before the UNet is placed
    def to(self, *args: Any, **kwargs: Any) -> DeepFloydIFGuidance:
        """Move to a device; on the device it will run (a GPU, or the CPU of a machine without one) embed the
        prompts now, so T5 is loaded, used and freed before training starts and never beside the UNet."""
        super().to(*args, **kwargs)
        device = self.execution_device
        if device.type == "cuda" or not torch.cuda.is_available():
            self.embed_prompts()
        return self

    def embed_prompts(self) -> None:
        """Every prompt embedding, from the disk cache or T5 (once; the encoder is released right after)."""
        if self._placed != self.execution_device:  # before the UNet takes the device's memory
            self.prompts.embeddings(self.execution_device, self.dtype)

    def _ready(self) -> None:
        self.embed_prompts()
        super()._ready()

    # ------------------------------------------------------------------ pixel space
    def encode(self, rgb: Tensor) -> Tensor:
        """Renders [B, H, W, 3] in 0..1 -> [B, 3, R, R] in [-1, 1], differentiably (no VAE)."""
        self._ready()
        if self._cuda_graphs:  # encode starts every step: a new CUDA-graph generation
            torch.compiler.cudagraph_mark_step_begin()
        if self.latent_input:
            raise ValueError("DeepFloyd IF works on RGB pixels: system.latent_steps needs stable-diffusion guidance")
        if rgb.shape[-1] != 3:
            raise ValueError(f"DeepFloyd IF guidance expects [B,H,W,3] renders in 0..1, got {tuple(rgb.shape)}")
        return pixel_input(rgb.to(self.execution_device), self.cfg.resolution)

    def decode(self, x: Tensor) -> Tensor:
        return (x.float() * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)

    def unet_forward(self, x: Tensor, t: Tensor, context: Tensor, class_labels: Tensor | None = None) -> Tensor:
        """The UNet's noise prediction [N, 3, R, R] (its learned-variance channels dropped)."""
        return epsilon_channels(super().unet_forward(x, t, context, class_labels), x.shape[1])
