"""Rigid rotations of Gaussian parameters, for file formats whose axes differ from lift3d's world.

A rotation R moves each Gaussian's mean (R mu), its orientation (q_R * q) and its view-dependent color:
the rotated Gaussian seen along d looks like the original seen along R^T d, so each SH band l gets a
(2l+1) x (2l+1) matrix. That matrix is solved here by least squares from the basis itself
(``lift3d.render.splats.sh.sh_bases``) at a fixed set of directions, in float64: exact to rounding for any
rotation, with no hand-written Wigner tables to get wrong.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lift3d.render.splats.sh import degree_of, sh_bases

# lift3d's world is +z up; glTF (and the .glb meshes lift3d writes) is +y up: (x, y, z) -> (x, z, -y).
Z_UP_TO_Y_UP = ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0), (0.0, -1.0, 0.0))
# A 180-degree turn about x, (x, y, z) -> (x, -y, -z): between the .ply frame (right-down-front, as
# COLMAP-trained splats are) and right-up-back, the frame SPZ stores.
FLIP_YZ = ((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0))


def rotation_quat(matrix: Tensor) -> Tensor:
    """The unit wxyz quaternion [4] of a rotation matrix [3, 3] (Shepperd's method, float64)."""
    m = matrix.double().tolist()
    trace = m[0][0] + m[1][1] + m[2][2]
    if trace > 0:
        s = math.sqrt(trace + 1.0) * 2
        q = [s / 4, (m[2][1] - m[1][2]) / s, (m[0][2] - m[2][0]) / s, (m[1][0] - m[0][1]) / s]
    elif m[0][0] > m[1][1] and m[0][0] > m[2][2]:
        s = math.sqrt(1.0 + m[0][0] - m[1][1] - m[2][2]) * 2
        q = [(m[2][1] - m[1][2]) / s, s / 4, (m[0][1] + m[1][0]) / s, (m[0][2] + m[2][0]) / s]
    elif m[1][1] > m[2][2]:
        s = math.sqrt(1.0 + m[1][1] - m[0][0] - m[2][2]) * 2
        q = [(m[0][2] - m[2][0]) / s, (m[0][1] + m[1][0]) / s, s / 4, (m[1][2] + m[2][1]) / s]
    else:
        s = math.sqrt(1.0 + m[2][2] - m[0][0] - m[1][1]) * 2
        q = [(m[1][0] - m[0][1]) / s, (m[0][2] + m[2][0]) / s, (m[1][2] + m[2][1]) / s, s / 4]
    return torch.tensor(q, dtype=torch.float64)


def quat_multiply(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a * b of wxyz quaternions [..., 4] (broadcasting)."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], dim=-1)


def _directions(count: int = 256) -> Tensor:
    """A fixed spread of unit directions [count, 3] (a Fibonacci sphere), float64."""
    i = torch.arange(count, dtype=torch.float64) + 0.5
    z = 1.0 - 2.0 * i / count
    r = (1.0 - z * z).sqrt()
    phi = i * math.pi * (3.0 - math.sqrt(5.0))
    return torch.stack([r * phi.cos(), r * phi.sin(), z], dim=-1)


def sh_rotation(matrix: Tensor, degree: int) -> Tensor:
    """[K, K] block-diagonal matrix X, K = (degree+1)^2, with sh_bases(R^T d) = sh_bases(d) @ X for every d:
    coefficients c [K] become X c when the Gaussians rotate by R (band 0 stays 1)."""
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


def rotate_gaussians(params: dict[str, Tensor], matrix) -> dict[str, Tensor]:
    """Pre-activation parameters (``means``, ``log_scales``, ``quats`` wxyz, ``opacity_logits``, ``sh0``, ``shN``)
    of the Gaussians turned by the rotation ``matrix`` [3, 3] about the origin; scales and opacities are unchanged."""
    r = torch.as_tensor(matrix, dtype=torch.float64)
    if not torch.allclose(r @ r.T, torch.eye(3, dtype=torch.float64), atol=1e-9) or torch.linalg.det(r) < 0:
        raise ValueError("rotate_gaussians needs a proper rotation matrix (orthonormal, determinant +1)")
    means = (params["means"].double() @ r.T).to(params["means"].dtype)
    quats = quat_multiply(rotation_quat(r), params["quats"].double()).to(params["quats"].dtype)
    shN = params["shN"]
    if shN.shape[1]:
        x = sh_rotation(r, degree_of(shN.shape[1] + 1))[1:, 1:]
        shN = torch.einsum("jk,nkc->njc", x, shN.double()).to(shN.dtype)
    return {**params, "means": means, "quats": quats, "shN": shN}
