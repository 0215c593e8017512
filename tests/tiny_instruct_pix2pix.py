"""A tiny random-weight InstructPix2Pix folder for tests: the diffusers layout of ``timbrooks/instruct-pix2pix``
(a UNet with 8 input channels, VAE, CLIP text encoder and tokenizer, the Euler scheduler it ships with), built
locally and loaded back through the editor's real ``from_pretrained`` path."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.tiny_diffusion import TEXT_DIM, write_tokenizer


def build_tiny_instruct_pix2pix(path: str | Path, seed: int = 0) -> Path:
    """Write the folder at ``path`` and return it."""
    from diffusers import AutoencoderKL, EulerAncestralDiscreteScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    root = Path(path)
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(sample_size=8, in_channels=8, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=TEXT_DIM,
                                attention_head_dim=4, norm_num_groups=4)
    vae = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(4, 4, 8, 8),
                        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        layers_per_block=1, norm_num_groups=2, sample_size=64)
    vocab = write_tokenizer(root / "tokenizer")
    text = CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=TEXT_DIM, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=77, projection_dim=TEXT_DIM,
                                        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1))
    scheduler = EulerAncestralDiscreteScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012,
                                                beta_schedule="scaled_linear", prediction_type="epsilon")
    for name, part in (("unet", unet), ("vae", vae), ("text_encoder", text), ("scheduler", scheduler)):
        part.save_pretrained(root / name)
    index = {"_class_name": "StableDiffusionInstructPix2PixPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "vae": ["diffusers", "AutoencoderKL"], "text_encoder": ["transformers", "CLIPTextModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "scheduler": ["diffusers", "EulerAncestralDiscreteScheduler"]}
    (root / "model_index.json").write_text(json.dumps(index, indent=1))
    return root


_BUILT: list[Path] = []


def tiny_instruct_pix2pix_path() -> Path:
    """A tiny InstructPix2Pix folder built once per test session (and removed at exit)."""
    if not _BUILT:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="lift3d-tiny-ip2p-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _BUILT.append(build_tiny_instruct_pix2pix(folder / "model"))
    return _BUILT[0]
