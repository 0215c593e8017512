"""VGGT (Visual Geometry Grounded Transformer, Meta, CVPR 2025) in plain PyTorch: photos of a scene -> each photo's
camera and depth map in one forward pass.

The network as released (``facebook/VGGT-1B``): DINOv2-L with 4 register tokens embeds each photo (14-pixel
patches, 518 pixels wide); a camera token and 4 register tokens join each photo's patch tokens (the first photo has
its own pair: it defines the world); 24 frame blocks (attention within each photo) alternate with 24 global blocks
(attention across every token of every photo), 1024 wide, 16 heads. The camera head reads the camera tokens, the
DPT depth head reads layers 4, 11, 17 and 23 (each the frame and the global block's output side by side, 2048 wide).
Module and parameter names are the checkpoint's (``aggregator.frame_blocks.3.attn.qkv.weight``), so the released
state dict loads as it is (``lift3d.generators.vggt_files``). The point and track heads are not built: lift3d
unprojects the depth maps with the predicted cameras instead, as the authors recommend.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from lift3d.generators.vggt_heads import CameraHead, DPTHead
from lift3d.generators.vggt_layers import Block, DinoBackbone, patch_positions, rotary_tables

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RELEASED_DPT_LAYERS = (4, 11, 17, 23)  # of 24


@dataclass(frozen=True)
class VggtArchitecture:
    """The sizes of a VGGT network (defaults: VGGT-1B as released)."""

    embed_dim: int = 1024  # token width of the backbone and the aggregator
    depth: int = 24  # frame blocks (and as many global blocks)
    num_heads: int = 16  # heads of the aggregator, the backbone and the camera trunk
    backbone_depth: int = 24  # DINOv2 blocks
    num_register_tokens: int = 4  # register tokens of the backbone and of each photo in the aggregator
    patch_size: int = 14
    img_size: int = 518  # the square grid the backbone's position embedding is trained on
    camera_trunk_depth: int = 4
    dpt_features: int = 256
    dpt_channels: tuple[int, ...] = (256, 512, 1024, 1024)

    @property
    def dpt_layers(self) -> tuple[int, ...]:
        """The aggregator layers the DPT head reads: the released ones, spread the same way over another depth."""
        return tuple(max(0, round((i + 1) * self.depth / 24) - 1) for i in RELEASED_DPT_LAYERS)


def frame_chunks(frames: int, size: int) -> list[slice]:
    """Slices of at most ``size`` frames (all at once when ``size`` <= 0)."""
    size = frames if size <= 0 else size
    return [slice(start, min(start + size, frames)) for start in range(0, frames, size)]


class Aggregator(nn.Module):
    """Photos [S, 3, H, W] in 0..1 -> the tokens of the layers asked for, each [S, 1 + registers + patches, 2C]."""

    def __init__(self, arch: VggtArchitecture) -> None:
        super().__init__()
        dim = arch.embed_dim
        self.patch_size, self.num_heads = arch.patch_size, arch.num_heads
        self.patch_embed = DinoBackbone(dim, arch.backbone_depth, arch.num_heads, arch.patch_size, arch.img_size,
                                        arch.num_register_tokens)
        self.frame_blocks = nn.ModuleList([Block(dim, arch.num_heads, qk_norm=True, rope=True) for _ in range(arch.depth)])
        self.global_blocks = nn.ModuleList([Block(dim, arch.num_heads, qk_norm=True, rope=True) for _ in range(arch.depth)])
        self.camera_token = nn.Parameter(torch.randn(1, 2, 1, dim) * 1e-6)  # [first photo, the others]
        self.register_token = nn.Parameter(torch.randn(1, 2, arch.num_register_tokens, dim) * 1e-6)
        self.patch_start_idx = 1 + arch.num_register_tokens
        self.register_buffer("_resnet_mean", torch.zeros(1, 3, 1, 1), persistent=False)
        self.register_buffer("_resnet_std", torch.ones(1, 3, 1, 1), persistent=False)
        self.reset_constants()

    def reset_constants(self) -> None:
        """The ImageNet color statistics the photos are normalized with (not in the checkpoint: set after loading)."""
        if self._resnet_mean.device.type != "meta":
            self._resnet_mean.copy_(torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
            self._resnet_std.copy_(torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))

    def special_tokens(self, frames: int) -> Tensor:
        """[S, 1 + registers, C]: the first photo's camera and register tokens, then the others'."""
        special = torch.cat([self.camera_token, self.register_token], dim=2)[0]  # [2, 1 + R, C]
        return torch.cat([special[:1], special[1:].expand(frames - 1, -1, -1)])

    def forward(self, images: Tensor, keep: tuple[int, ...], chunk: int = 0) -> dict[int, Tensor]:
        S, _, H, W = images.shape
        rows, cols = H // self.patch_size, W // self.patch_size
        normalized = (images - self._resnet_mean) / self._resnet_std
        patches = torch.cat([self.patch_embed(normalized[part]) for part in frame_chunks(S, chunk)])
        tokens = torch.cat([self.special_tokens(S).to(patches.dtype), patches], 1)  # [S, P, C]
        P, C = tokens.shape[1:]
        rope = rotary_tables(patch_positions(S, rows, cols, self.patch_start_idx, images.device), C // self.num_heads)
        global_rope = tuple(t.reshape(1, S * P, -1) for t in rope)
        kept = {}
        for i, (frame_block, global_block) in enumerate(zip(self.frame_blocks, self.global_blocks)):
            tokens = torch.cat([frame_block(tokens[part], tuple(t[part] for t in rope)) for part in frame_chunks(S, chunk)])
            framed = tokens
            tokens = global_block(tokens.reshape(1, S * P, C), global_rope).reshape(S, P, C)
            if i in keep:
                kept[i] = torch.cat([framed, tokens], -1)
        return kept


class VggtNetwork(nn.Module):
    """The aggregator, the camera head and the depth head of VGGT (names as released)."""

    def __init__(self, arch: VggtArchitecture | None = None) -> None:
        super().__init__()
        self.arch = arch = arch or VggtArchitecture()
        self.aggregator = Aggregator(arch)
        self.camera_head = CameraHead(2 * arch.embed_dim, arch.num_heads, arch.camera_trunk_depth)
        self.depth_head = DPTHead(2 * arch.embed_dim, arch.patch_size, 2, arch.dpt_features, arch.dpt_channels, "exp")

    def forward(self, images: Tensor, chunk: int = 8, autocast_dtype: torch.dtype | None = None) -> dict[str, Tensor]:
        """Photos [S, 3, H, W] in 0..1 (sides multiples of the patch size) -> ``pose`` [S, 9] (the camera head's
        encoding), ``depth`` [S, H, W] and ``confidence`` [S, H, W]. ``chunk`` photos at a time go through the
        backbone, the frame blocks and the depth head (0: all at once); the aggregator runs under CUDA autocast in
        ``autocast_dtype`` when given, the heads in float32."""
        S, _, H, W = images.shape
        if H % self.arch.patch_size or W % self.arch.patch_size:
            raise ValueError(f"VGGT takes photos whose sides are multiples of {self.arch.patch_size} pixels, got {W}x{H}")
        layers = tuple(sorted({*self.arch.dpt_layers, self.arch.depth - 1}))
        autocast = (torch.autocast(images.device.type, dtype=autocast_dtype) if autocast_dtype is not None
                    else contextlib.nullcontext())
        with autocast:
            tokens = self.aggregator(images, layers, chunk)
        start = self.aggregator.patch_start_idx
        pose = self.camera_head(tokens[self.arch.depth - 1][:, 0].float())
        depths, confidences = [], []
        for part in frame_chunks(S, chunk):
            depth, confidence = self.depth_head([tokens[i][part, start:].float() for i in self.arch.dpt_layers], H, W)
            depths.append(depth[..., 0])
            confidences.append(confidence)
        return {"pose": pose, "depth": torch.cat(depths), "confidence": torch.cat(confidences)}
