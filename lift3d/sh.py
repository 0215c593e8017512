"""Real spherical harmonics in the convention of 3DGS and gsplat: the one home of the basis.

``degree`` is always the highest degree l: degree d has (d + 1)^2 bases in the order l = 0..d and, within a band,
m = -l..l (degree 3: 16 bases). Gaussians store coefficients ``[..., K, 3]`` up to degree 3 (``MAX_DEGREE``); a
color is ``max(sum_k Y_k(d) c_k + 0.5, 0)`` where ``d`` is the unit direction from the camera center to the
Gaussian, and the DC term ``c_0`` stores (rgb - 0.5) / Y_0. The directional encoding of materials and backgrounds is
the same basis, up to degree 4 (``MAX_BASIS_DEGREE``). ``sh_rotation`` turns coefficients with a rotation.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Y0 = 0.5 / math.sqrt(math.pi)  # the constant band: 0.28209479...
MAX_DEGREE = 3  # the highest degree Gaussians (and their files) carry
MAX_BASIS_DEGREE = 4  # the highest degree of the basis (the directional encoding's 25 values)


def num_bases(degree: int, max_degree: int = MAX_DEGREE) -> int:
    """Number of SH bases up to ``degree``: (degree + 1)^2; a degree outside 0..``max_degree`` is an error."""
    if not 0 <= degree <= max_degree:
        raise ValueError(f"spherical-harmonics degree must be 0..{max_degree}, got {degree}")
    return (degree + 1) ** 2


def degree_of(n_bases: int) -> int:
    """Inverse of ``num_bases`` (Gaussians: 1, 4, 9 or 16 bases)."""
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
    """SH basis values [..., (degree+1)^2] at unit directions ``dirs`` [..., 3], degree 0..4; orthonormal on the
    sphere (the integral of Y_i Y_j is delta_ij)."""
    num_bases(degree, MAX_BASIS_DEGREE)
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
    if degree >= 4:  # written for unit directions (z^2 = 1 - x^2 - y^2 folded in)
        c4a = 0.75 * math.sqrt(35.0 / math.pi)
        c4b = 0.75 * math.sqrt(35.0 / (2.0 * math.pi))
        c4c = 0.75 * math.sqrt(5.0 / math.pi)
        c4d = 0.75 * math.sqrt(5.0 / (2.0 * math.pi))
        c4e = 3.0 / 16.0 * math.sqrt(1.0 / math.pi)
        c4f = 3.0 / 8.0 * math.sqrt(5.0 / math.pi)
        c4g = 3.0 / 16.0 * math.sqrt(35.0 / math.pi)
        out += [
            c4a * x * y * (xx - yy),
            -c4b * y * z * (3.0 * xx - yy),
            c4c * x * y * (7.0 * zz - 1.0),
            -c4d * y * z * (7.0 * zz - 3.0),
            c4e * (35.0 * zz * zz - 30.0 * zz + 3.0),
            -c4d * x * z * (7.0 * zz - 3.0),
            c4f * (xx - yy) * (7.0 * zz - 1.0),
            -c4b * x * z * (xx - 3.0 * yy),
            c4g * (xx * (xx - 3.0 * yy) - yy * (3.0 * xx - yy)),
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


def _directions(count: int = 256) -> Tensor:
    """A fixed spread of unit directions [count, 3] (a Fibonacci sphere), float64."""
    i = torch.arange(count, dtype=torch.float64) + 0.5
    z = 1.0 - 2.0 * i / count
    r = (1.0 - z * z).sqrt()
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    return torch.stack([r * phi.cos(), r * phi.sin(), z], dim=-1)


def sh_rotation(matrix: Tensor, degree: int) -> Tensor:
    """[K, K] block-diagonal matrix X, K = (degree+1)^2, with sh_bases(R^T d) = sh_bases(d) @ X for every d:
    coefficients c [K] become X c when what they color rotates by R (band 0 stays 1).

    Each band's (2l+1) x (2l+1) block is solved by least squares from the basis itself at a fixed set of
    directions, in float64: exact to rounding for any rotation, with no hand-written Wigner tables to get wrong."""
    dirs = _directions()
    rotated = dirs @ matrix.double()  # rows are R^T d
    a, b = sh_bases(degree, dirs), sh_bases(degree, rotated)
    out = torch.zeros(a.shape[1], a.shape[1], dtype=torch.float64)
    for band in range(degree + 1):
        s = slice(band * band, (band + 1) ** 2)
        out[s, s] = torch.linalg.lstsq(a[:, s], b[:, s]).solution
    # the solve leaves ~1e-16 noise that varies from call to call (threaded BLAS); entries that are 0 or +-1 within
    # 1e-9 are made exact, so axis flips and quarter turns convert SH exactly and the same way every time
    return torch.where((out - out.round()).abs() < 1e-9, out.round(), out)
