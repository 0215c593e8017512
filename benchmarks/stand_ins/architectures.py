"""The released models' architectures (the config fields that set their shapes), and tiny versions for CPU smoke
runs: the stand-ins build these with random weights, so a benchmark computes what the real model computes without
downloading it."""

from __future__ import annotations

# stabilityai/stable-diffusion-2-1-base unet/config.json and vae/config.json (architecture fields)
SD21_UNET = {
    "sample_size": 64, "in_channels": 4, "out_channels": 4, "center_input_sample": False, "flip_sin_to_cos": True,
    "freq_shift": 0, "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "only_cross_attention": False, "block_out_channels": [320, 640, 1280, 1280], "layers_per_block": 2, "downsample_padding": 1,
    "mid_block_scale_factor": 1, "act_fn": "silu", "norm_num_groups": 32, "norm_eps": 1e-5, "cross_attention_dim": 1024,
    "attention_head_dim": [5, 10, 20, 20], "dual_cross_attention": False, "use_linear_projection": True,
    "upcast_attention": False, "num_class_embeds": None, "class_embed_type": None, "resnet_time_scale_shift": "default",
}
SD21_VAE = {
    "in_channels": 3, "out_channels": 3, "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "block_out_channels": [128, 256, 512, 512], "layers_per_block": 2, "act_fn": "silu", "latent_channels": 4,
    "norm_num_groups": 32, "sample_size": 768, "scaling_factor": 0.18215,
}
TINY_UNET = {**SD21_UNET, "sample_size": 8, "block_out_channels": [8, 16, 16, 16], "norm_num_groups": 4,
             "cross_attention_dim": 32, "attention_head_dim": [2, 2, 2, 2], "layers_per_block": 1}
TINY_VAE = {**SD21_VAE, "block_out_channels": [4, 4, 8, 8], "norm_num_groups": 2, "layers_per_block": 1}

# MVDream's camera MLP over SD 2.1's UNet (the flattened 4x4 camera, 16 inputs)
MVDREAM_UNET = {"class_embed_type": "projection", "projection_class_embeddings_input_dim": 16}

# Stable Zero123 / Zero123-XL: SD 1.5's UNet with 8 input channels, and a CLIP ViT-L/14 image encoder
SD15_UNET_8CH = {**SD21_UNET, "in_channels": 8, "cross_attention_dim": 768, "attention_head_dim": 8,
                 "use_linear_projection": False}
CLIP_VIT_L14 = {"image_size": 224, "patch_size": 14, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                "num_attention_heads": 16, "projection_dim": 768}

# timbrooks/instruct-pix2pix's UNet: SD-1.5's (768-wide CLIP context, 8 heads) with 8 input channels
SD15_IP2P_UNET = {
    "sample_size": 64, "in_channels": 8, "out_channels": 4, "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
    "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3, "block_out_channels": [320, 640, 1280, 1280],
    "layers_per_block": 2, "cross_attention_dim": 768, "attention_head_dim": 8, "norm_num_groups": 32,
}
TINY_IP2P_UNET = {**SD15_IP2P_UNET, "block_out_channels": [8, 16, 16, 16], "norm_num_groups": 4, "cross_attention_dim": 32,
                  "attention_head_dim": 2, "layers_per_block": 1}

IF_I_XL_UNET = {  # DeepFloyd/IF-I-XL-v1.0 unet/config.json (architecture keys)
    "sample_size": 64, "in_channels": 3, "out_channels": 6, "act_fn": "gelu", "addition_embed_type": "text",
    "addition_embed_type_num_heads": 64, "attention_head_dim": 64, "block_out_channels": [704, 1408, 2112, 2816],
    "cross_attention_dim": 2816, "cross_attention_norm": "group_norm",
    "down_block_types": ["ResnetDownsampleBlock2D", "SimpleCrossAttnDownBlock2D", "SimpleCrossAttnDownBlock2D",
                         "SimpleCrossAttnDownBlock2D"],
    "up_block_types": ["SimpleCrossAttnUpBlock2D", "SimpleCrossAttnUpBlock2D", "SimpleCrossAttnUpBlock2D",
                       "ResnetUpsampleBlock2D"],
    "encoder_hid_dim": 4096, "encoder_hid_dim_type": "text_proj", "layers_per_block": 3,
    "mid_block_type": "UNetMidBlock2DSimpleCrossAttn", "resnet_time_scale_shift": "scale_shift", "norm_num_groups": 32,
    "norm_eps": 1e-5, "flip_sin_to_cos": True, "freq_shift": 0, "only_cross_attention": False, "upcast_attention": False,
    "use_linear_projection": False,
}
