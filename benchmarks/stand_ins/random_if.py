"""DeepFloyd IF stage I with random weights of the real shapes, for benchmarks on machines that cannot download it.

The UNet is IF-I-XL-v1.0's (unet/config.json of DeepFloyd/IF-I-XL-v1.0: 4.30B parameters, 64x64 pixels in, noise +
variance out): the same compute as the real model. The text encoder is NOT T5-v1.1-XXL (4.7B parameters) but a
1-layer random T5 of the same output width (4096) with a character-level tokenizer: lift3d embeds the prompts once
and caches them on disk, so the encoder's size only matters before training; benchmarks measure the cached case.

    python -m benchmarks.stand_ins.random_if /tmp/random-if-i-xl      # writes a diffusers folder (~8.7 GB in fp16)
    lift3d generate "a DSLR photo of a hamburger" --method dreamfusion-if \\
        system.guidance.pretrained_model_name_or_path=/tmp/random-if-i-xl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks.stand_ins.architectures import IF_I_XL_UNET
from lift3d.guidance.deepfloyd_if import IF_MAX_LENGTH, T5TextEncoder
from lift3d.guidance.loading import DiffusionModels
from tests.tiny_deepfloyd import if_scheduler, tiny_if_unet_config, write_t5_tokenizer


def t5_config(width: int, vocab_size: int):
    """A 1-layer T5 encoder config of output width ``width`` (a stand-in for T5-v1.1-XXL's 24 layers)."""
    from transformers import T5Config

    heads = max(width // 64, 1)
    return T5Config(vocab_size=vocab_size, d_model=width, d_kv=width // heads, d_ff=min(4 * width, 1024), num_layers=1,
                    num_heads=heads, feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                    pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def build_if_models(tiny: bool, device: torch.device, folder: Path) -> DiffusionModels:
    """Random-weight IF-I-XL-shaped (or tiny) UNet on ``device`` (fp16 on CUDA) and a factory of a random 1-layer
    T5 of output width 4096 (or the tiny width); ``folder`` receives the tokenizer files."""
    from diffusers import UNet2DConditionModel
    from transformers import AutoTokenizer, T5EncoderModel

    unet_cfg = tiny_if_unet_config() if tiny else IF_I_XL_UNET
    torch.manual_seed(0)
    with torch.device(device):
        unet = UNet2DConditionModel(**unet_cfg)
    unet.to(torch.float16 if device.type == "cuda" else torch.float32).requires_grad_(False).eval()
    vocab = write_t5_tokenizer(folder / "tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(folder / "tokenizer")
    width = unet_cfg["encoder_hid_dim"]

    def text_encoder(device: torch.device, dtype: torch.dtype) -> T5TextEncoder:
        torch.manual_seed(1)
        t5_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # whatever dtype the caller asks
        model = T5EncoderModel(t5_config(width, vocab)).to(device=device, dtype=t5_dtype)
        return T5TextEncoder(tokenizer, model.requires_grad_(False).eval(), IF_MAX_LENGTH)

    return DiffusionModels(unet, None, if_scheduler().alphas_cumprod.float(), "epsilon", text_encoder,
                           f"bench-random-if-i-xl{'-tiny' if tiny else ''}#t5-max-length={IF_MAX_LENGTH}")


def write_random_if(path: str | Path, tiny: bool = False, dtype: torch.dtype = torch.float16) -> Path:
    """Write the folder (IF's diffusers layout, no VAE) at ``path`` unless it is already complete; return it."""
    from diffusers import UNet2DConditionModel
    from transformers import T5EncoderModel

    root = Path(path)
    if (root / "model_index.json").exists():
        return root
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # random init of 4.3B weights: faster on a GPU
    unet_cfg = tiny_if_unet_config() if tiny else IF_I_XL_UNET
    torch.manual_seed(0)
    with torch.device(device):
        unet = UNet2DConditionModel(**unet_cfg)
    vocab = write_t5_tokenizer(root / "tokenizer")
    text = T5EncoderModel(t5_config(unet_cfg["encoder_hid_dim"], vocab))
    save_dtype = dtype if device.type == "cuda" else torch.float32
    unet.to(save_dtype).save_pretrained(root / "unet")
    text.to(save_dtype).save_pretrained(root / "text_encoder")
    if_scheduler().save_pretrained(root / "scheduler")
    index = {"_class_name": "IFPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "T5Tokenizer"],
             "scheduler": ["diffusers", "DDPMScheduler"]}
    (root / "model_index.json").write_text(json.dumps(index, indent=1))  # last: marks the folder complete
    return root


if __name__ == "__main__":
    print(write_random_if(sys.argv[1], tiny="--tiny" in sys.argv))
