"""An InstructPix2Pix-shaped model folder with random weights (timbrooks/instruct-pix2pix's SD-1.5 UNet with 8 input
channels, SD's VAE, a 2-layer CLIP text encoder of the right width): the same compute as the real editor, nothing
downloaded. Point ``lift3d edit`` at it with ``system.editor.pretrained_model_name_or_path=DIR``.

    python -m benchmarks.stand_ins.random_ip2p /tmp/random-ip2p          # writes the folder (~2.1 GB in fp16)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks.stand_ins.architectures import SD15_IP2P_UNET, SD21_VAE, TINY_IP2P_UNET, TINY_VAE
from tests.tiny_diffusion import write_tokenizer


def write_random_instruct_pix2pix(path: str | Path, tiny: bool = False) -> Path:
    """A diffusers InstructPix2Pix folder with random weights (fp16 on a GPU) at ``path`` unless already complete."""
    from diffusers import AutoencoderKL, DDPMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    path = Path(path)
    if (path / "model_index.json").exists():
        return path
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        unet = UNet2DConditionModel(**(TINY_IP2P_UNET if tiny else SD15_IP2P_UNET))
        vae = AutoencoderKL(**(TINY_VAE if tiny else SD21_VAE))
    width = unet.config.cross_attention_dim
    vocab = write_tokenizer(path / "tokenizer")
    text = CLIPTextModel(CLIPTextConfig(vocab_size=vocab, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=2,
                                        num_attention_heads=max(width // 64, 1), max_position_embeddings=77, projection_dim=width,
                                        bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1))
    for name, model in (("unet", unet), ("vae", vae), ("text_encoder", text)):
        model.to(dtype=dtype).save_pretrained(path / name)
    DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                  prediction_type="epsilon", clip_sample=False).save_pretrained(path / "scheduler")
    (path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionInstructPix2PixPipeline"}))
    return path


if __name__ == "__main__":
    print(write_random_instruct_pix2pix(sys.argv[1], tiny="--tiny" in sys.argv))
