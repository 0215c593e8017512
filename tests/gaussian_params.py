"""Random pre-activation Gaussian parameters for the file-format tests, inside every format's coded range."""

from __future__ import annotations

import torch

from lift3d.rotations import quaternion_to_matrix
from lift3d.sh import num_bases


def random_params(n: int = 64, degree: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """``means`` within +-3, log scales in [-6, 0], unnormalized wxyz quats, logits within +-4, DC within +-3
    and higher SH bands within +-0.9 (SPZ's byte ranges hold all of them unclipped)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "means": (torch.randn(n, 3, generator=g) * 1.2).clamp(-3, 3),
        "log_scales": torch.rand(n, 3, generator=g) * -6.0,
        "quats": torch.randn(n, 4, generator=g) * 2.0,
        "opacity_logits": (torch.randn(n, generator=g) * 2.0).clamp(-4, 4),
        "sh0": (torch.randn(n, 1, 3, generator=g) * 0.8).clamp(-3, 3),
        "shN": (torch.randn(n, num_bases(degree) - 1, 3, generator=g) * 0.3).clamp(-0.9, 0.9),
    }


def unit(quats: torch.Tensor) -> torch.Tensor:
    return quats / quats.norm(dim=-1, keepdim=True)


def same_sign(reference: torch.Tensor, quats: torch.Tensor) -> torch.Tensor:
    """``quats`` [N, 4] flipped where needed to lie on ``reference``'s side (q and -q are one rotation)."""
    return quats * torch.where((quats * reference).sum(-1, keepdim=True) < 0, -1.0, 1.0)


def covariances(log_scales: torch.Tensor, quats: torch.Tensor) -> torch.Tensor:
    """[N, 3, 3] covariances R diag(s^2) R^T: what a renderer sees, whatever the quaternion's sign convention."""
    r = quaternion_to_matrix(quats.double())
    return r @ torch.diag_embed((2 * log_scales.double()).exp()) @ r.transpose(1, 2)
