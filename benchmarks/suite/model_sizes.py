"""Parameter counts of the models lift3d loads, built at their released sizes on the meta device (nothing allocated,
nothing downloaded): the README's table of what each task needs quotes them. Prints one JSON line.

    python -m benchmarks model_sizes
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from benchmarks.stand_ins.architectures import (
    CLIP_VIT_L14,
    IF_I_XL_UNET,
    MVDREAM_UNET,
    SD15_IP2P_UNET,
    SD15_UNET_8CH,
    SD21_UNET,
    SD21_VAE,
)


def count(*modules: torch.nn.Module) -> int:
    """Parameters of the modules together."""
    return sum(p.numel() for module in modules for p in module.parameters())


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m benchmarks model_sizes", description=__doc__.splitlines()[0]).parse_args(argv)
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPVisionConfig,
        CLIPVisionModelWithProjection,
        T5Config,
        T5EncoderModel,
        ViTConfig,
    )

    from lift3d.generators.triposr import DINO_VITB16
    from lift3d.generators.triposr_model import TripoSRArchitecture, TripoSRNetwork

    with torch.device("meta"):
        vae = AutoencoderKL(**SD21_VAE)
        openclip_h = CLIPTextModel(CLIPTextConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=23,
                                                  num_attention_heads=16, projection_dim=512, hidden_act="gelu"))
        clip_l = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                              num_attention_heads=12))
        counts = {
            "sd21_base": count(UNet2DConditionModel(**SD21_UNET), vae, openclip_h),
            "mvdream": count(UNet2DConditionModel(**{**SD21_UNET, **MVDREAM_UNET}), vae, openclip_h),
            "zero123": count(UNet2DConditionModel(**SD15_UNET_8CH), vae,
                             CLIPVisionModelWithProjection(CLIPVisionConfig(**CLIP_VIT_L14))),
            "instruct_pix2pix": count(UNet2DConditionModel(**SD15_IP2P_UNET), vae, clip_l),
            "if_i_xl_unet": count(UNet2DConditionModel(**IF_I_XL_UNET)),
            "t5_v1_1_xxl_encoder": count(T5EncoderModel(T5Config(
                d_model=4096, d_ff=10240, num_layers=24, num_heads=64, d_kv=64, vocab_size=32128,
                feed_forward_proj="gated-gelu"))),
            "triposr": count(TripoSRNetwork(TripoSRArchitecture(), ViTConfig(**DINO_VITB16))),
        }
    print(json.dumps({"bench": "model_sizes", "parameters": counts,
                      "gb_fp16": {name: round(n * 2 / 1e9, 2) for name, n in counts.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
