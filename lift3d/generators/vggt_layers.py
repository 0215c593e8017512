"""The transformer layers of VGGT (Meta, CVPR 2025), named as its released checkpoint names them.

A ``Block`` is a pre-norm ViT block with layer scale (``norm1 attn ls1 norm2 mlp ls2``); VGGT's frame and global
blocks add a LayerNorm on each head's queries and keys (``attn.q_norm``, ``attn.k_norm``) and a 2D rotary position
embedding (RoPE, base frequency 100: half of each head's channels turn with the patch row, half with its column).
``DinoBackbone`` is DINOv2's ViT with register tokens (``patch_embed.proj``, ``cls_token``, ``register_tokens``,
``pos_embed`` for a 37 x 37 grid, resampled bicubically for other grids, ``blocks``, ``norm``), which turns each
photo into one token per 14 x 14 patch.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

ROPE_BASE = 100.0  # VGGT's rotary base frequency


def rotary_tables(positions: Tensor, head_dim: int, base: float = ROPE_BASE) -> tuple[Tensor, Tensor]:
    """The cosines and sines [..., N, head_dim] of VGGT's 2D rotary embedding at ``positions`` [..., N, 2] (row,
    column): the first half of each head's channels turns with the row, the second half with the column, each half
    as 1D RoPE over its two quarters. Computed once a forward pass, shared by every block."""
    quarter = head_dim // 4
    inv_freq = 1.0 / base ** (torch.arange(0, 2 * quarter, 2, device=positions.device, dtype=torch.float32) / (2 * quarter))
    angles = [positions[..., axis].float()[..., None] * inv_freq for axis in (0, 1)]  # [..., N, quarter] each
    angles = torch.cat([angles[0], angles[0], angles[1], angles[1]], -1)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
    """``x`` [B, heads, N, d] turned by ``rotary_tables`` [B, N, d]: within each half, (a, b) -> (a cos - b sin,
    b cos + a sin) for its two quarters a and b."""
    cos, sin = (t[:, None] for t in tables)
    parts = x.float().unflatten(-1, (2, 2, -1))  # [..., axis, quarter, d / 4]
    turned = torch.stack([-parts[..., 1, :], parts[..., 0, :]], dim=-2).flatten(-3)
    return (x.float() * cos + turned * sin).to(x.dtype)


def patch_positions(frames: int, rows: int, cols: int, special: int, device: torch.device) -> Tensor:
    """[frames, special + rows * cols, 2] (row, column) positions: 0 for the special tokens, 1.. for the patches."""
    grid = torch.cartesian_prod(torch.arange(rows, device=device), torch.arange(cols, device=device)) + 1
    grid = torch.cat([torch.zeros(special, 2, dtype=grid.dtype, device=device), grid])
    return grid[None].expand(frames, -1, -1)


class LayerScale(nn.Module):
    """A learned per-channel factor on a residual branch (``gamma``)."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """``fc1``, GELU, ``fc2``."""

    def __init__(self, dim: int, hidden: int, out: int | None = None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out or dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head self-attention (``qkv``, ``proj``), with optional per-head query/key LayerNorms and 2D RoPE."""

    def __init__(self, dim: int, num_heads: int, qk_norm: bool = False, rope: bool = False) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"attention width {dim} is not a multiple of {num_heads} heads")
        self.num_heads, self.head_dim, self.rope = num_heads, dim // num_heads, rope
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """``x`` [B, N, C]; ``rope``: the ``rotary_tables`` [B, N, head_dim] of its tokens' positions."""
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:
            q, k = apply_rotary(q, rope), apply_rotary(k, rope)
        q, k = q.to(v.dtype), k.to(v.dtype)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


class Block(nn.Module):
    """Pre-norm transformer block with layer scale: ``x + ls1(attn(norm1(x)))``, then ``+ ls2(mlp(norm2(x)))``."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, init_values: float = 0.01,
                 qk_norm: bool = False, rope: bool = False, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qk_norm, rope)
        self.ls1 = LayerScale(dim, init_values)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, init_values)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None) -> Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """A strided convolution (``proj``): one token per patch, [B, rows * cols, C]."""

    def __init__(self, patch_size: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)


class DinoBackbone(nn.Module):
    """DINOv2's ViT with register tokens: normalized photos [B, 3, H, W] -> patch tokens [B, rows * cols, C]."""

    def __init__(self, dim: int, depth: int, num_heads: int, patch_size: int = 14, img_size: int = 518,
                 num_register_tokens: int = 4) -> None:
        super().__init__()
        self.patch_size = patch_size
        grid = img_size // patch_size
        self.patch_embed = PatchEmbed(patch_size, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, grid * grid + 1, dim) * 0.02)
        self.register_tokens = nn.Parameter(torch.zeros(1, num_register_tokens, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, dim), requires_grad=False)  # released, unused at inference
        self.blocks = nn.ModuleList([Block(dim, num_heads, init_values=1.0, norm_eps=1e-6) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def position_embedding(self, rows: int, cols: int) -> Tensor:
        """[1, 1 + rows * cols, C]: the class token's and the patch grid's, resampled (bicubic, antialiased) from
        the square grid it was trained on when the grid differs."""
        n = self.pos_embed.shape[1] - 1
        side = int(math.isqrt(n))
        if rows == cols == side:
            return self.pos_embed
        pos = self.pos_embed.float()
        grid = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(rows, cols), mode="bicubic", antialias=True)
        grid = grid.permute(0, 2, 3, 1).reshape(1, rows * cols, -1)
        return torch.cat([pos[:, :1], grid], 1).to(self.pos_embed.dtype)

    def forward(self, images: Tensor) -> Tensor:
        rows, cols = images.shape[-2] // self.patch_size, images.shape[-1] // self.patch_size
        x = self.patch_embed(images)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1).to(x.dtype), x], 1)
        x = x + self.position_embedding(rows, cols).to(x.dtype)
        x = torch.cat([x[:, :1], self.register_tokens.expand(len(x), -1, -1).to(x.dtype), x[:, 1:]], 1)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)[:, 1 + self.register_tokens.shape[1]:]
