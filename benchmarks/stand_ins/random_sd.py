"""Stable Diffusion 2.1-base-shaped models with random weights, for benchmarks on machines that cannot download the
real one: the UNet and VAE have the real architecture (same compute). ``build_sd_models`` makes them in memory with a
stand-in text encoder; ``write_random_sd21`` writes a diffusers folder whose text encoder is a 2-layer CLIP of the
right width (prompts are embedded once per run, so its size does not matter) with a byte-level tokenizer. Point a
recipe at the folder with ``system.guidance.pretrained_model_name_or_path=DIR``.

    python -m benchmarks.stand_ins.random_sd /tmp/random-sd21          # writes the folder (~1.9 GB in fp16)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.stand_ins.architectures import SD21_UNET, SD21_VAE, TINY_UNET, TINY_VAE
from lift3d.guidance.loading import DiffusionModels
from lift3d.guidance.score import scaled_linear_alphas_cumprod
from tests.tiny_diffusion import write_tokenizer


def build_sd_models(tiny: bool, device: torch.device, unet_extra: dict[str, Any] | None = None) -> DiffusionModels:
    """Random-weight SD-2.1-base-shaped (or tiny) UNet and VAE on ``device`` (fp16 on CUDA), and a stand-in text
    encoder; ``unet_extra`` changes the UNet's config (``MVDREAM_UNET``: an MVDream-shaped UNet)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    unet_cfg, vae_cfg = (TINY_UNET, TINY_VAE) if tiny else (SD21_UNET, SD21_VAE)
    unet_cfg = {**unet_cfg, **(unet_extra or {})}
    torch.manual_seed(0)
    with torch.device(device):
        unet, vae = UNet2DConditionModel(**unet_cfg), AutoencoderKL(**vae_cfg)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    unet.to(dtype).requires_grad_(False).eval()
    vae.to(dtype).requires_grad_(False).eval()
    width = unet_cfg["cross_attention_dim"]

    def text_encoder(device: torch.device, dtype: torch.dtype):
        return lambda texts: torch.randn(len(texts), 77, width, generator=torch.Generator().manual_seed(len(texts)))

    return DiffusionModels(unet, vae, scaled_linear_alphas_cumprod().float(), "epsilon", text_encoder, "bench-random-sd21")


def write_random_sd21(path: str | Path, tiny: bool = False, dtype: torch.dtype = torch.float16,
                      unet_extra: dict | None = None) -> Path:
    """Write the folder (diffusers layout) at ``path`` unless it is already complete; return it. ``unet_extra``
    changes the UNet's config (``random_mvdream``: MVDream's camera embedding)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    root = Path(path)
    if (root / "model_index.json").exists():
        return root
    unet_cfg, vae_cfg = (TINY_UNET, TINY_VAE) if tiny else (SD21_UNET, SD21_VAE)
    unet_cfg = {**unet_cfg, **(unet_extra or {})}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # random init of 865M weights: faster on a GPU
    torch.manual_seed(0)
    with torch.device(device):
        unet, vae = UNet2DConditionModel(**unet_cfg), AutoencoderKL(**vae_cfg)
    width = unet_cfg["cross_attention_dim"]
    vocab = write_tokenizer(root / "tokenizer")
    text = CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=2,
                                        num_attention_heads=max(width // 64, 1), max_position_embeddings=77, projection_dim=width,
                                        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1))
    for name, model in (("unet", unet), ("vae", vae), ("text_encoder", text)):
        model.to(dtype=dtype if device.type == "cuda" else torch.float32).save_pretrained(root / name)
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"]}
    return finish_folder(root, index)


def finish_folder(root: Path, index: dict) -> Path:
    """Add Stable Diffusion's DDPM scheduler (scaled-linear betas, epsilon prediction) to the model folder ``root``,
    then its ``model_index.json`` (``index`` plus the scheduler), written last: it marks the folder complete."""
    from diffusers import DDPMScheduler

    DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                  prediction_type="epsilon", clip_sample=False).save_pretrained(root / "scheduler")
    index = {**index, "scheduler": ["diffusers", "DDPMScheduler"]}
    (root / "model_index.json").write_text(json.dumps(index, indent=1))
    return root


if __name__ == "__main__":
    print(write_random_sd21(sys.argv[1], tiny="--tiny" in sys.argv))
