"""A VGGT release with random weights of the released sizes (VGGT-1B: 24 + 24 blocks 1024 wide, DINOv2-L, the camera
and depth heads), in the released layout (one state dict keyed as released), so that benchmarks run the real
compute and the real loading path without downloading anything.

    python -m benchmarks.stand_ins.random_vggt /tmp/random-vggt      # writes model.safetensors (~2.3 GB in fp16)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from lift3d.generators.vggt_model import VggtArchitecture, VggtNetwork


def random_network(arch: VggtArchitecture | None = None, device: str | torch.device = "cpu", seed: int = 0) -> VggtNetwork:
    """The network with random weights (PyTorch's default initialization, made on ``device``)."""
    torch.manual_seed(seed)
    with torch.device(device):
        network = VggtNetwork(arch)
    network.aggregator.reset_constants()
    return network.eval().requires_grad_(False)


def write_random_release(folder: str | Path, arch: VggtArchitecture | None = None, dtype: torch.dtype = torch.float16,
                         device: str | torch.device = "cpu") -> Path:
    """``folder/model.safetensors``: the random network's state dict under the released names, in ``dtype``."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    network = random_network(arch, device)
    path = folder / "model.safetensors"
    save_file({k: v.to(dtype).contiguous().cpu() for k, v in network.state_dict().items()}, str(path))
    return path


if __name__ == "__main__":
    print(write_random_release(sys.argv[1]))
