"""Real spherical harmonics up to degree 3 in the convention of 3DGS and gsplat.

Coefficients are stored ``[..., K, 3]`` with K = (degree + 1)^2 bases in the order l = 0, 1, 2, 3 and,
within a band, m = -l..l; a color is ``max(sum_k Y_k(d) c_k + 0.5, 0)`` where ``d`` is the unit
direction from the camera center to the Gaussian. The DC term ``c_0`` stores (rgb - 0.5) / Y_0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Y0 = 0.5 / math.sqrt(math.pi)  # the constant band: 0.28209479...
MAX_DEGREE = 3


def num_bases(degree: int) -> int:
    """Number of SH bases of a given degree: (degree + 1)^2."""
    if not 0 <= degree <= MAX_DEGREE:
        raise ValueError(f"spherical-harmonics degree must be 0..{MAX_DEGREE}, got {degree}")
    return (degree + 1) ** 2


def degree_of(n_bases: int) -> int:
    """Inverse of ``num_bases``."""
    degree = round(math.sqrt(n_bases)) - 1
    if degree < 0 or (degree + 1) ** 2 != n_bases or degree > MAX_DEGREE:
        raise ValueError(f"{n_bases} is not a number of SH bases (1, 4, 9 or 16)")
    return degree


def rgb_to_sh(rgb: Tensor) -> Tensor:
    """DC coefficient [..., 3] whose color is ``rgb`` in every direction."""
    return (rgb - 0.5) / Y0


def sh_to_rgb(dc: Tensor) -> Tensor:
    """Color [..., 3] of a DC coefficient (before the 0-clamp)."""
    return dc * Y0 + 0.5


def sh_bases(degree: int, dirs: Tensor) -> Tensor:
    """SH basis values [..., (degree+1)^2] at unit directions ``dirs`` [..., 3]."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, Y0)]
    if degree >= 1:
        c1 = math.sqrt(3.0 / (4.0 * math.pi))
        out += [-c1 * y, c1 * z, -c1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        c2a = 0.5 * math.sqrt(15.0 / math.pi)
        c2b = 0.25 * math.sqrt(5.0 / math.pi)
        c2c = 0.25 * math.sqrt(15.0 / math.pi)
        out += [c2a * x * y, -c2a * y * z, c2b * (2.0 * zz - xx - yy), -c2a * x * z, c2c * (xx - yy)]
    if degree >= 3:
        c3a = 0.25 * math.sqrt(35.0 / (2.0 * math.pi))
        c3b = 0.5 * math.sqrt(105.0 / math.pi)
        c3c = 0.25 * math.sqrt(21.0 / (2.0 * math.pi))
        c3d = 0.25 * math.sqrt(7.0 / math.pi)
        c3e = 0.25 * math.sqrt(105.0 / math.pi)
        out += [
            -c3a * y * (3.0 * xx - yy),
            c3b * x * y * z,
            -c3c * y * (4.0 * zz - xx - yy),
            c3d * z * (2.0 * zz - 3.0 * xx - 3.0 * yy),
            -c3c * x * (4.0 * zz - xx - yy),
            c3e * z * (xx - yy),
            -c3a * x * (xx - 3.0 * yy),
        ]
    return torch.stack(out, dim=-1)


def eval_sh(degree: int, coeffs: Tensor, dirs: Tensor) -> Tensor:
    """Raw SH sum [..., 3] of ``coeffs`` [..., K, 3] (K >= (degree+1)^2) along ``dirs`` [..., 3].

    ``dirs`` need not be unit length; only the first (degree+1)^2 coefficients are used.
    """
    k = num_bases(degree)
    if coeffs.shape[-2] < k:
        raise ValueError(f"SH degree {degree} needs {k} coefficients per channel, got {coeffs.shape[-2]}")
    unit = dirs / dirs.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    bases = sh_bases(degree, unit)
    return (bases[..., None] * coeffs[..., :k, :]).sum(dim=-2)


def sh_to_color(degree: int, coeffs: Tensor, dirs: Tensor) -> Tensor:
    """Color [..., 3] as 3DGS and gsplat define it: ``max(eval_sh + 0.5, 0)`` (no upper clamp)."""
    return (eval_sh(degree, coeffs, dirs) + 0.5).clamp_min(0.0)
