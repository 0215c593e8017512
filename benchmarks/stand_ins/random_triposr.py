"""A TripoSR release with random weights of the released sizes (DINO ViT-B/16 at 512 px, 16 blocks of 1024-wide
triplane tokens, 3 x 40 x 64 x 64 planes, a 9-layer decoder), in the released layout, and ``sculpt_sphere``: random
weights make an almost constant density, so benchmarks that mesh or march set the generated field to a sphere of
the same network (same sizes, same cost) first.

    python -m benchmarks.stand_ins.random_triposr /tmp/random-triposr          # writes the folder (~0.8 GB in fp16)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from lift3d.generators.triposr import DINO_VITB16, release_config, released_state_dict
from lift3d.generators.triposr_model import TripoSRArchitecture, TripoSRNetwork


def write_random_release(folder: str | Path, arch: TripoSRArchitecture | None = None, vit_sizes: dict | None = None) -> Path:
    """A TripoSR folder (config.yaml + model.safetensors, released names) with random weights of the real sizes
    (or of ``arch`` and the ViT's ``vit_sizes``: tiny models for CPU smoke runs)."""
    from safetensors.torch import save_file
    from transformers import ViTConfig

    folder = Path(folder)
    torch.manual_seed(0)
    arch = arch or TripoSRArchitecture()
    vit = ViTConfig(**(vit_sizes or DINO_VITB16))
    vit.save_pretrained(folder / "dino-vitb16")
    network = TripoSRNetwork(arch, vit)
    (folder / "config.yaml").write_text(release_config(arch, folder / "dino-vitb16"))
    save_file({k: v.half().contiguous() for k, v in released_state_dict(network).items()}, str(folder / "model.safetensors"))
    return folder


@torch.no_grad()
def sculpt_sphere(field: torch.nn.Module, radius: float = 0.5, iso: float = 25.0) -> None:
    """Set the field's planes and decoder so its density crosses ``iso`` on a sphere of ``radius`` (same sizes, same cost):
    channel 0 of each plane holds -(u^2 + v^2), the decoder passes their sum through (SiLU is near identity above 4)."""
    planes, layers = field.triplane, [m for m in field.decoder.layers if isinstance(m, torch.nn.Linear)]
    c, r = planes.shape[1], planes.shape[-1]
    u = (torch.arange(r, device=planes.device) + 0.5) / r * 2 - 1
    planes.zero_()
    planes[:, 0] = -(u[None, :] ** 2 + u[:, None] ** 2)
    for i, layer in enumerate(layers):
        layer.weight.zero_()
        layer.bias.zero_()
        if i == 0:
            layer.weight[:, [0, c, 2 * c]] = 1.0
            layer.bias.fill_(10.0)
        elif i < len(layers) - 1:
            layer.weight.copy_(torch.eye(layer.weight.shape[0], device=planes.device))
    k, unit_r = 20.0, radius / field.cfg.radius  # raw density = k * (sum - s_iso) + log(iso) + 1 - bias
    s_iso = -2 * unit_r**2
    last = layers[-1]
    last.weight[0, 0] = k
    last.bias[0] = -k * (10.0 + s_iso) + math.log(iso) + 1 - field.cfg.density_bias
    last.bias[1:] = torch.tensor([1.0, 0.0, -1.0], device=planes.device)


if __name__ == "__main__":
    print(write_random_release(sys.argv[1]))
