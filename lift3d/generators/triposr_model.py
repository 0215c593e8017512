"""TripoSR's network in plain PyTorch, with the module tree (and so the weight names) of the released checkpoint.

    image [B, 3, S, S] --DINO ViT (transformers ViTModel)--> image tokens [B, 1 + (S/16)^2, 768]
    learned triplane tokens [B, C, 3 P^2] --Transformer1D (self-attention, cross-attention to the image tokens)-->
    [B, C, 3 P^2] -> planes [B, 3, C, P, P] --ConvTranspose2d x2--> triplane [B, 3, C', 2P, 2P]

Top-level modules: ``image_tokenizer.model`` (ViTModel), ``tokenizer.embeddings``, ``backbone`` (``norm``,
``proj_in``, ``transformer_blocks.N.{norm1,attn1,norm2,attn2,norm3,ff}``, ``proj_out``), ``post_processor.upsample``
and ``decoder.layers`` (the NeRF MLP, which lives in the field: ``lift3d.fields.triplane``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lift3d.fields.triplane import TriplaneDecoder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class TripoSRArchitecture:
    """The sizes a released ``config.yaml`` fixes (defaults: the released TripoSR)."""

    cond_image_size: int = 512  # input image side
    plane_size: int = 32  # tokenizer.plane_size: triplane tokens per plane side
    num_channels: int = 1024  # tokenizer.num_channels: token width (backbone.in_channels)
    num_attention_heads: int = 16  # backbone heads
    attention_head_dim: int = 64  # backbone head width
    num_layers: int = 16  # backbone transformer blocks
    cross_attention_dim: int = 768  # the ViT's hidden size
    norm_num_groups: int = 32  # backbone.norm groups
    out_channels: int = 40  # post_processor.out_channels: channels per output plane
    n_neurons: int = 64  # decoder width
    n_hidden_layers: int = 9  # decoder hidden layers
    decoder_activation: str = "silu"  # decoder activation
    radius: float = 0.87  # renderer.radius
    density_activation: str = "exp"  # renderer.density_activation
    density_bias: float = -1.0  # renderer.density_bias


class Attention(nn.Module):
    """Multi-head attention with ``to_q``, ``to_k``, ``to_v`` (no bias) and ``to_out`` (Linear, Dropout)."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int | None = None) -> None:
        super().__init__()
        inner, context_dim = heads * head_dim, context_dim or dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """x [B, N, dim], context [B, M, context_dim] (None: self-attention) -> [B, N, dim]."""
        context = x if context is None else context
        b = x.shape[0]

        def heads(t: Tensor) -> Tensor:
            return t.reshape(b, t.shape[1], self.heads, -1).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.to_q(x)), heads(self.to_k(context)), heads(self.to_v(context)))
        return self.to_out[0](out.transpose(1, 2).reshape(b, x.shape[1], -1))


class GEGLU(nn.Module):
    """``proj`` to twice the width, then value * gelu(gate)."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.proj(x).chunk(2, dim=-1)
        return value * F.gelu(gate)


class FeedForward(nn.Module):
    """``net`` = [GEGLU(dim -> 4 dim), Dropout, Linear(4 dim -> dim)]."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x: Tensor) -> Tensor:
        for module in self.net:
            x = module(x)
        return x


class TransformerBlock(nn.Module):
    """Pre-norm self-attention, cross-attention to the image tokens, feed-forward; each with a residual."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, head_dim, context_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, context: Tensor) -> Tensor:
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context)
        return x + self.ff(self.norm3(x))


class Transformer1D(nn.Module):
    """Tokens [B, C, N] -> [B, C, N]: group norm, ``proj_in``, blocks, ``proj_out``, plus the input (residual)."""

    def __init__(self, arch: TripoSRArchitecture) -> None:
        super().__init__()
        inner = arch.num_attention_heads * arch.attention_head_dim
        self.norm = nn.GroupNorm(arch.norm_num_groups, arch.num_channels, eps=1e-6)
        self.proj_in = nn.Linear(arch.num_channels, inner)
        self.transformer_blocks = nn.ModuleList([
            TransformerBlock(inner, arch.num_attention_heads, arch.attention_head_dim, arch.cross_attention_dim)
            for _ in range(arch.num_layers)
        ])
        self.proj_out = nn.Linear(inner, arch.num_channels)

    def forward(self, tokens: Tensor, context: Tensor) -> Tensor:
        h = self.proj_in(self.norm(tokens).transpose(1, 2))
        for block in self.transformer_blocks:
            h = block(h, context)
        return self.proj_out(h).transpose(1, 2) + tokens


class ImageTokenizer(nn.Module):
    """The DINO ViT (``model``): ImageNet-normalized images [B, 3, S, S] -> tokens [B, 1 + patches, hidden]."""

    def __init__(self, vit_config: object) -> None:
        super().__init__()
        from transformers import ViTModel

        self.model = ViTModel(vit_config)
        self.register_buffer("image_mean", torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("image_std", torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        normalized = (images - self.image_mean.to(images.dtype)) / self.image_std.to(images.dtype)
        return self.model(normalized, interpolate_pos_encoding=True).last_hidden_state


class TriplaneTokenizer(nn.Module):
    """The learned triplane tokens (``embeddings`` [3, C, P, P]) and the way back from tokens to planes."""

    def __init__(self, plane_size: int, channels: int) -> None:
        super().__init__()
        self.plane_size = plane_size
        self.embeddings = nn.Parameter(torch.randn(3, channels, plane_size, plane_size) / math.sqrt(channels))

    def forward(self, batch_size: int) -> Tensor:
        """Tokens [B, C, 3 P^2] (planes, then rows, then columns)."""
        tokens = self.embeddings.permute(1, 0, 2, 3).reshape(1, self.embeddings.shape[1], -1)
        return tokens.expand(batch_size, -1, -1)

    def detokenize(self, tokens: Tensor) -> Tensor:
        """Tokens [B, C, 3 P^2] -> planes [B, 3, C, P, P]."""
        b, c, _ = tokens.shape
        return tokens.reshape(b, c, 3, self.plane_size, self.plane_size).permute(0, 2, 1, 3, 4)


class TriplaneUpsample(nn.Module):
    """``upsample``: a 2x2 stride-2 transposed convolution per plane, [B, 3, C, P, P] -> [B, 3, C', 2P, 2P]."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.upsample = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=2, stride=2)

    def forward(self, planes: Tensor) -> Tensor:
        b = planes.shape[0]
        up = self.upsample(planes.flatten(0, 1))
        return up.reshape(b, 3, *up.shape[1:])


class TripoSRNetwork(nn.Module):
    """Images [B, 3, S, S] in 0..1 (object on gray) -> triplanes [B, 3, C', 2P, 2P]; ``decoder`` decodes them."""

    def __init__(self, arch: TripoSRArchitecture, vit_config: object) -> None:
        super().__init__()
        self.arch = arch
        self.image_tokenizer = ImageTokenizer(vit_config)
        self.tokenizer = TriplaneTokenizer(arch.plane_size, arch.num_channels)
        self.backbone = Transformer1D(arch)
        self.post_processor = TriplaneUpsample(arch.num_channels, arch.out_channels)
        self.decoder = TriplaneDecoder(3 * arch.out_channels, arch.n_neurons, arch.n_hidden_layers, arch.decoder_activation)

    def forward(self, images: Tensor) -> Tensor:
        context = self.image_tokenizer(images)
        tokens = self.backbone(self.tokenizer(images.shape[0]).to(context.dtype), context)
        return self.post_processor(self.tokenizer.detokenize(tokens))
