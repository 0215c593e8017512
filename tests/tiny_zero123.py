"""A tiny random-weight Zero123 folder for tests (diffusers layout: unet/ with 8 input channels, vae/,
image_encoder/ (CLIP vision + projection), cc_projection/, scheduler/), built locally, never downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import torch

EMBED_DIM = 32  # CLIP projection width = the UNet's cross-attention width


def build_tiny_zero123(path: str | Path, seed: int = 0) -> Path:
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    root = Path(path)
    torch.manual_seed(seed)
    UNet2DConditionModel(
        sample_size=8, in_channels=8, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=EMBED_DIM, attention_head_dim=4, norm_num_groups=4,
    ).save_pretrained(root / "unet")
    AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(4, 4, 8, 8),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=1,
        norm_num_groups=2, sample_size=64,
    ).save_pretrained(root / "vae")
    CLIPVisionModelWithProjection(CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        projection_dim=EMBED_DIM,
    )).save_pretrained(root / "image_encoder")
    projection = torch.nn.Linear(EMBED_DIM + 4, EMBED_DIM)
    (root / "cc_projection").mkdir(parents=True)
    (root / "cc_projection" / "config.json").write_text(json.dumps({"_class_name": "CCProjection", "in_channel": EMBED_DIM + 4,
                                                                    "out_channel": EMBED_DIM}))
    save_file({f"projection.{k}": v.contiguous() for k, v in projection.state_dict().items()},
              str(root / "cc_projection" / "diffusion_pytorch_model.safetensors"))
    DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                  clip_sample=False).save_pretrained(root / "scheduler")
    index = {"_class_name": "Zero1to3StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "vae": ["diffusers", "AutoencoderKL"], "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
             "cc_projection": ["pipeline_zero1to3", "CCProjection"], "scheduler": ["diffusers", "DDPMScheduler"]}
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root


_BUILT: list[Path] = []


def tiny_zero123_path() -> Path:
    """A tiny Zero123 folder built once per test session (and removed at exit)."""
    if not _BUILT:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="lift3d-tiny-zero123-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _BUILT.append(build_tiny_zero123(folder / "model"))
    return _BUILT[0]
