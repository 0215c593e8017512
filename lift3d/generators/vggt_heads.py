"""VGGT's heads, named as its released checkpoint names them: the camera head (``camera_head``) and the DPT head
that predicts depth and its confidence (``depth_head``; the released ``point_head`` is the same head with 4 outputs).

The camera head reads each photo's camera token from the last aggregator layer and refines a pose encoding four
times (an adaptive LayerNorm conditioned on the previous estimate, a 4-block trunk that attends across the photos):
``[t (3), q (4, x y z w), fov_h, fov_w]``, the world-to-camera translation and rotation (OpenCV axes, the first
photo's camera as the world) and the vertical and horizontal fields of view (radians). ``pose_to_cameras`` decodes
it. The DPT head fuses the patch tokens of four aggregator layers into a map at the photo's resolution: depth
(``exp``) and confidence (``1 + exp``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lift3d.generators.vggt_layers import Block, Mlp
from lift3d.rotations import quaternion_to_matrix

POSE_SIZE = 9  # translation 3, quaternion 4, fields of view 2


# ----------------------------------------------------------------------------------------------- cameras
def pose_to_cameras(pose: Tensor, height: int, width: int) -> tuple[Tensor, Tensor]:
    """World-to-camera [..., 3, 4] (OpenCV axes) and intrinsics [..., 3, 3] (principal point at the center) of pose
    encodings [..., 9] for images of ``height`` x ``width`` pixels."""
    rotation = quaternion_to_matrix(pose[..., [6, 3, 4, 5]])  # VGGT's x y z w as lift3d's w x y z
    w2c = torch.cat([rotation, pose[..., :3, None]], -1)
    K = torch.zeros(*pose.shape[:-1], 3, 3, dtype=pose.dtype, device=pose.device)
    K[..., 0, 0] = (width / 2) / torch.tan(pose[..., 8] / 2)
    K[..., 1, 1] = (height / 2) / torch.tan(pose[..., 7] / 2)
    K[..., 0, 2], K[..., 1, 2], K[..., 2, 2] = width / 2, height / 2, 1.0
    return w2c, K


class CameraHead(nn.Module):
    """Camera tokens [S, 2C] of the last layer -> pose encodings [S, 9], refined over ``iterations``."""

    def __init__(self, dim: int, num_heads: int, trunk_depth: int = 4) -> None:
        super().__init__()
        self.trunk = nn.Sequential(*[Block(dim, num_heads, init_values=0.01) for _ in range(trunk_depth)])
        self.token_norm = nn.LayerNorm(dim)
        self.trunk_norm = nn.LayerNorm(dim)
        self.empty_pose_tokens = nn.Parameter(torch.zeros(1, 1, POSE_SIZE))
        self.embed_pose = nn.Linear(POSE_SIZE, dim)
        self.poseLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 3 * dim))
        self.adaln_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.pose_branch = Mlp(dim, dim // 2, POSE_SIZE)

    def forward(self, camera_tokens: Tensor, iterations: int = 4) -> Tensor:
        tokens = self.token_norm(camera_tokens)[None]  # [1, S, 2C]: the trunk attends across the photos
        pose = None
        for _ in range(iterations):
            condition = self.embed_pose(self.empty_pose_tokens.expand(*tokens.shape[:2], -1) if pose is None else pose)
            shift, scale, gate = self.poseLN_modulation(condition).chunk(3, dim=-1)
            x = tokens + gate * (self.adaln_norm(tokens) * (1 + scale) + shift)
            delta = self.pose_branch(self.trunk_norm(self.trunk(x)))
            pose = delta if pose is None else pose + delta
        fov = F.relu(pose[..., 7:])  # the fields of view are positive; translation and quaternion pass as they are
        return torch.cat([pose[..., :7], fov], -1)[0]


# ----------------------------------------------------------------------------------------------- DPT
def uv_embedding(channels: int, rows: int, cols: int, aspect: float, device: torch.device) -> Tensor:
    """[channels, rows, cols] sine-cosine embedding of a grid spanning the image, scaled by its diagonal
    (x in -aspect/diag..aspect/diag, y in -1/diag..1/diag at pixel centers), base 100."""
    diagonal = (aspect**2 + 1.0) ** 0.5
    span_x, span_y = aspect / diagonal, 1.0 / diagonal
    x = torch.linspace(-span_x * (cols - 1) / cols, span_x * (cols - 1) / cols, cols, device=device)
    y = torch.linspace(-span_y * (rows - 1) / rows, span_y * (rows - 1) / rows, rows, device=device)
    quarter = channels // 4
    omega = 1.0 / 100.0 ** (torch.arange(quarter, device=device, dtype=torch.float32) / quarter)
    ex, ey = x[:, None] * omega, y[:, None] * omega  # [cols, q], [rows, q]
    ex = torch.cat([ex.sin(), ex.cos()], -1)[None].expand(rows, -1, -1)
    ey = torch.cat([ey.sin(), ey.cos()], -1)[:, None].expand(-1, cols, -1)
    return torch.cat([ex, ey], -1).permute(2, 0, 1)


def with_position(x: Tensor, aspect: float, ratio: float = 0.1) -> Tensor:
    """``x`` [B, C, h, w] plus ``ratio`` x the grid's ``uv_embedding``."""
    return x + ratio * uv_embedding(x.shape[1], x.shape[2], x.shape[3], aspect, x.device).to(x.dtype)[None]


class ResidualConvUnit(nn.Module):
    """``relu(x) + conv2(relu(conv1(relu(x))))``: the released unit's in-place ReLU also rectifies its skip."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(features, features, 3, padding=1)
        self.conv2 = nn.Conv2d(features, features, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(x)
        return self.conv2(F.relu(self.conv1(x))) + x


class FusionBlock(nn.Module):
    """Adds the (refined) skip features, refines, upsamples (bilinear, corners aligned) and projects (``out_conv``)."""

    def __init__(self, features: int, has_residual: bool = True) -> None:
        super().__init__()
        self.out_conv = nn.Conv2d(features, features, 1)
        if has_residual:
            self.resConfUnit1 = ResidualConvUnit(features)
        self.resConfUnit2 = ResidualConvUnit(features)

    def forward(self, x: Tensor, skip: Tensor | None = None, size: tuple[int, int] | None = None) -> Tensor:
        if skip is not None:
            x = x + self.resConfUnit1(skip)
        x = self.resConfUnit2(x)
        size = size or (x.shape[-2] * 2, x.shape[-1] * 2)
        return self.out_conv(F.interpolate(x, size=size, mode="bilinear", align_corners=True))


class DPTHead(nn.Module):
    """Patch tokens of four layers -> a dense map [S, H, W, outputs - 1] and its confidence [S, H, W]."""

    def __init__(self, dim: int, patch_size: int = 14, outputs: int = 2, features: int = 256,
                 out_channels: tuple[int, ...] = (256, 512, 1024, 1024), activation: str = "exp") -> None:
        super().__init__()
        self.patch_size, self.activation = patch_size, activation
        self.norm = nn.LayerNorm(dim)
        self.projects = nn.ModuleList([nn.Conv2d(dim, c, 1) for c in out_channels])
        self.resize_layers = nn.ModuleList([
            nn.ConvTranspose2d(out_channels[0], out_channels[0], 4, stride=4),
            nn.ConvTranspose2d(out_channels[1], out_channels[1], 2, stride=2),
            nn.Identity(),
            nn.Conv2d(out_channels[3], out_channels[3], 3, stride=2, padding=1),
        ])
        self.scratch = nn.Module()
        for i, channels in enumerate(out_channels, start=1):
            setattr(self.scratch, f"layer{i}_rn", nn.Conv2d(channels, features, 3, padding=1, bias=False))
        for i in range(1, 5):
            setattr(self.scratch, f"refinenet{i}", FusionBlock(features, has_residual=i != 4))
        self.scratch.output_conv1 = nn.Conv2d(features, features // 2, 3, padding=1)
        self.scratch.output_conv2 = nn.Sequential(nn.Conv2d(features // 2, 32, 3, padding=1), nn.ReLU(),
                                                  nn.Conv2d(32, outputs, 1))

    def forward(self, layers: list[Tensor], height: int, width: int) -> tuple[Tensor, Tensor]:
        """``layers``: four [S, patches, 2C] patch-token maps (special tokens removed) of photos ``height`` x ``width``."""
        rows, cols = height // self.patch_size, width // self.patch_size
        aspect = width / height
        maps = []
        for tokens, project, resize in zip(layers, self.projects, self.resize_layers):
            x = self.norm(tokens).transpose(1, 2).reshape(len(tokens), -1, rows, cols)
            maps.append(resize(with_position(project(x), aspect)))
        s = self.scratch
        rn = [s.layer1_rn(maps[0]), s.layer2_rn(maps[1]), s.layer3_rn(maps[2]), s.layer4_rn(maps[3])]
        x = s.refinenet4(rn[3], size=rn[2].shape[2:])
        x = s.refinenet3(x, rn[2], size=rn[1].shape[2:])
        x = s.refinenet2(x, rn[1], size=rn[0].shape[2:])
        x = s.output_conv1(s.refinenet1(x, rn[0]))
        x = F.interpolate(x, size=(rows * self.patch_size, cols * self.patch_size), mode="bilinear", align_corners=True)
        out = s.output_conv2(with_position(x, aspect)).permute(0, 2, 3, 1)
        values, confidence = out[..., :-1], 1.0 + out[..., -1].exp()
        if self.activation == "exp":
            values = values.exp()
        else:  # inv_log: the point head's world points
            values = torch.sign(values) * torch.expm1(values.abs())
        return values, confidence
