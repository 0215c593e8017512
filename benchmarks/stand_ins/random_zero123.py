"""A Stable-Zero123-shaped model folder with random weights, for benchmarks on machines that cannot download
the real one: the UNet is Stable Diffusion 1.5's with 8 input channels, the VAE SD's, the image encoder a
CLIP ViT-L/14 vision tower with its 768-wide projection, and the camera projection 772 -> 768 — the real
architectures, so the same compute. Point a recipe at it with ``system.guidance.pretrained_model_name_or_path=DIR``.

    python -m benchmarks.stand_ins.random_zero123 /tmp/random-zero123          # writes the folder (~1.9 GB in fp16)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks.stand_ins.architectures import CLIP_VIT_L14, SD15_UNET_8CH, SD21_VAE
from benchmarks.stand_ins.random_sd import finish_folder


def write_random_zero123(path: str | Path, dtype: torch.dtype = torch.float16) -> Path:
    """Write the folder (Zero123 diffusers layout) at ``path`` unless it is already complete; return it."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    root = Path(path)
    if (root / "model_index.json").exists():
        return root
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        parts = {"unet": UNet2DConditionModel(**SD15_UNET_8CH), "vae": AutoencoderKL(**SD21_VAE),
                 "image_encoder": CLIPVisionModelWithProjection(CLIPVisionConfig(**CLIP_VIT_L14))}
        projection = torch.nn.Linear(772, 768)
    for name, model in parts.items():
        model.to(dtype=dtype).save_pretrained(root / name)
    (root / "cc_projection").mkdir(parents=True, exist_ok=True)
    projection_config = {"_class_name": "CCProjection", "in_channel": 772, "out_channel": 768}
    (root / "cc_projection" / "config.json").write_text(json.dumps(projection_config))
    save_file({f"projection.{k}": v.to(dtype).contiguous().cpu() for k, v in projection.state_dict().items()},
              str(root / "cc_projection" / "diffusion_pytorch_model.safetensors"))
    index = {"_class_name": "Zero1to3StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "vae": ["diffusers", "AutoencoderKL"], "image_encoder": ["transformers", "CLIPVisionModelWithProjection"],
             "cc_projection": ["pipeline_zero1to3", "CCProjection"]}
    return finish_folder(root, index)


if __name__ == "__main__":
    print(write_random_zero123(sys.argv[1]))
