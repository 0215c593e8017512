"""An MVDream-shaped model folder with random weights, for benchmarks on machines that cannot download the
real one: Stable Diffusion 2.1-base's UNet (865M weights) with MVDream's camera MLP (``class_embed_type=
"projection"`` over the flattened 4x4 camera, 16 inputs) and its VAE, the same compute as the real model,
plus a 2-layer CLIP text encoder of the right width (``random_sd``). Point a recipe at it with
``system.guidance.pretrained_model_name_or_path=DIR``.

    python -m benchmarks.stand_ins.random_mvdream /tmp/random-mvdream          # writes the folder (~1.9 GB in fp16)
    lift3d generate "a DSLR photo of a hamburger" --method mvdream \
        system.guidance.pretrained_model_name_or_path=/tmp/random-mvdream
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from benchmarks.stand_ins.architectures import MVDREAM_UNET
from benchmarks.stand_ins.random_sd import write_random_sd21


def write_random_mvdream(path: str | Path, tiny: bool = False, dtype: torch.dtype = torch.float16) -> Path:
    """Write the folder (diffusers layout) at ``path`` unless it is already complete; return it."""
    return write_random_sd21(path, tiny=tiny, dtype=dtype, unet_extra=MVDREAM_UNET)


if __name__ == "__main__":
    print(write_random_mvdream(sys.argv[1], tiny="--tiny" in sys.argv))
