"""A tiny VGGT of the released architecture (4 + 4 blocks 32 wide, 2 heads, a 2-block backbone), with random weights,
saved as the release saves it: one state dict (``model.pt``, or ``model.safetensors``) keyed as released, the point
and track heads included (lift3d reads past them)."""

from __future__ import annotations

from pathlib import Path

import torch

from lift3d.generators.vggt_heads import DPTHead
from lift3d.generators.vggt_model import VggtArchitecture, VggtNetwork

TINY = VggtArchitecture(embed_dim=32, depth=4, num_heads=2, backbone_depth=2, camera_trunk_depth=1, dpt_features=16,
                        dpt_channels=(8, 16, 32, 32))
SIZE = 56  # the tiny model's input width in tests (4 patches)


def tiny_state(seed: int = 0, arch: VggtArchitecture = TINY) -> dict[str, torch.Tensor]:
    """The released layout's state dict of a random tiny VGGT, with a point head and a few track-head tensors."""
    torch.manual_seed(seed)
    network = VggtNetwork(arch)
    state = dict(network.state_dict())
    point_head = DPTHead(2 * arch.embed_dim, arch.patch_size, 4, arch.dpt_features, arch.dpt_channels, "inv_log")
    state.update({f"point_head.{k}": v for k, v in point_head.state_dict().items()})
    state["track_head.feature_extractor.norm.weight"] = torch.ones(arch.embed_dim)
    state["track_head.tracker.fmap_norm.weight"] = torch.ones(16)
    return state


def write_tiny_vggt(folder: Path, seed: int = 0, name: str = "model.pt") -> Path:
    """``folder/name`` (``model.pt`` through ``torch.save``, or ``model.safetensors``): the tiny VGGT's weights."""
    folder.mkdir(parents=True, exist_ok=True)
    state = tiny_state(seed)
    path = folder / name
    if name.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    return path
