"""Rotations: unit quaternions <-> 3 x 3 matrices, the quaternion product, axis-angle vectors <-> matrices.

The one home of this math. Quaternions are ``wxyz`` (w the real part), the order of the 3DGS .ply, gsplat, COLMAP
and viser; a quaternion q rotates by R(q) with R(q) v = q v q*. Pure functions on torch tensors of any float dtype,
batched over leading axes and differentiable; numpy callers use the ``*_np`` twins, which run the same code in
float64.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

# lift3d's world is +z up; glTF (the .glb meshes and Gaussians lift3d writes) is +y up: (x, y, z) -> (x, z, -y)
Z_UP_TO_Y_UP = ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0), (0.0, -1.0, 0.0))


def normalize_quaternion(wxyz: Tensor, eps: float = 1e-12) -> Tensor:
    """Unit quaternions [..., 4] (any norm above ``eps`` in)."""
    return wxyz / wxyz.norm(dim=-1, keepdim=True).clamp_min(eps)


def quaternion_to_matrix(wxyz: Tensor) -> Tensor:
    """Rotation matrices [..., 3, 3] of quaternions [..., 4] (wxyz, any norm: normalized first)."""
    w, x, y, z = normalize_quaternion(wxyz).unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ]  # fmt: skip
    return torch.stack(rows, dim=-1).reshape(wxyz.shape[:-1] + (3, 3))


def matrix_to_quaternion(matrix: Tensor) -> Tensor:
    """Unit quaternions [..., 4] (wxyz, w >= 0) of rotation matrices [..., 3, 3].

    Shepperd's method: each matrix is read through the branch of its largest quaternion component (the largest of
    trace, m00, m11, m22 picks it), so no square root of a small number enters."""
    m = matrix
    m00, m01, m02 = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    m10, m11, m12 = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    m20, m21, m22 = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    trace = m00 + m11 + m22
    # s = 4 |largest component| >= 2 on the branch taken; the clamp only keeps the other branches finite
    s = torch.stack([1.0 + trace, 1.0 + m00 - m11 - m22, 1.0 + m11 - m00 - m22, 1.0 + m22 - m00 - m11], -1)
    s = s.clamp_min(1e-12).sqrt() * 2
    sw, sx, sy, sz = s.unbind(-1)
    branches = torch.stack([
        torch.stack([sw / 4, (m21 - m12) / sw, (m02 - m20) / sw, (m10 - m01) / sw], -1),
        torch.stack([(m21 - m12) / sx, sx / 4, (m01 + m10) / sx, (m02 + m20) / sx], -1),
        torch.stack([(m02 - m20) / sy, (m01 + m10) / sy, sy / 4, (m12 + m21) / sy], -1),
        torch.stack([(m10 - m01) / sz, (m02 + m20) / sz, (m12 + m21) / sz, sz / 4], -1),
    ], -2)  # [..., 4 branches, 4]
    pick = torch.stack([trace, m00, m11, m22], -1).argmax(-1)
    q = branches.gather(-2, pick[..., None, None].expand(pick.shape + (1, 4))).squeeze(-2)
    q = normalize_quaternion(q)
    return torch.where(q[..., :1] < 0, -q, q)  # q and -q are one rotation: w >= 0


def quaternion_multiply(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product a * b of wxyz quaternions [..., 4] (broadcasting): the rotation b, then a."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack([aw * bw - ax * bx - ay * by - az * bz, aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx, aw * bz + ax * by - ay * bx + az * bw], dim=-1)


def slerp(q0: Tensor, q1: Tensor, t: Tensor) -> Tensor:
    """Spherical interpolation [N, 4] from ``q0`` to ``q1`` [N, 4] at ``t`` [N] in 0..1, along the shorter arc."""
    dot = (q0 * q1).sum(-1, keepdim=True)
    q1 = torch.where(dot < 0, -q1, q1)
    dot = dot.abs().clamp(max=1.0)
    angle = torch.acos(dot)
    t = t[:, None]
    small = angle < 1e-6
    sin = torch.sin(angle).clamp_min(1e-12)
    a = torch.where(small, 1 - t, torch.sin((1 - t) * angle) / sin)
    b = torch.where(small, t, torch.sin(t * angle) / sin)
    q = a * q0 + b * q1
    return q / q.norm(dim=-1, keepdim=True)


def skew(v: Tensor) -> Tensor:
    """The cross-product matrices [..., 3, 3] of vectors ``v`` [..., 3]."""
    x, y, z = v.unbind(-1)
    zero = torch.zeros_like(x)
    return torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=-1).reshape(*v.shape[:-1], 3, 3)


def so3_exp(w: Tensor) -> Tensor:
    """Rotation matrices [..., 3, 3] of axis-angle vectors ``w`` [..., 3] (Rodrigues), exact with finite gradients at
    and near zero (Taylor series below 1e-4 rad, where the closed form loses precision)."""
    theta2 = (w * w).sum(-1, keepdim=True)[..., None]  # [..., 1, 1]
    small = theta2 < 1e-8
    safe2 = torch.where(small, torch.ones_like(theta2), theta2)
    theta = safe2.sqrt()
    a = torch.where(small, 1.0 - theta2 / 6.0, torch.sin(theta) / theta)  # sin(t) / t
    b = torch.where(small, 0.5 - theta2 / 24.0, (1.0 - torch.cos(theta)) / safe2)  # (1 - cos(t)) / t^2
    K = skew(w)
    eye = torch.eye(3, dtype=w.dtype, device=w.device).expand_as(K)
    return eye + a * K + b * (K @ K)


def so3_log(R: Tensor) -> Tensor:
    """Axis-angle vectors [..., 3] of rotations ``R`` [..., 3, 3] with angles below pi (the inverse of ``so3_exp``)."""
    cos = ((R.diagonal(dim1=-2, dim2=-1).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    theta = torch.acos(cos)
    vee = torch.stack([R[..., 2, 1] - R[..., 1, 2], R[..., 0, 2] - R[..., 2, 0], R[..., 1, 0] - R[..., 0, 1]], -1)
    sin = torch.sin(theta)
    scale = torch.where(sin.abs() < 1e-6, 0.5 + theta**2 / 12.0, theta / (2.0 * sin.clamp_min(1e-12)))
    return vee * scale[..., None]


def rotation_error_deg(R_a: Tensor, R_b: Tensor) -> Tensor:
    """The angle [...] in degrees of the rotation between ``R_a`` and ``R_b`` [..., 3, 3] (geodesic distance)."""
    cos = (((R_a.transpose(-1, -2) @ R_b).diagonal(dim1=-2, dim2=-1).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos))


# ----------------------------------------------------------------------------------- numpy twins (float64)
def quaternion_to_matrix_np(wxyz: np.ndarray) -> np.ndarray:
    """``quaternion_to_matrix`` of a numpy array [..., 4] -> [..., 3, 3], float64."""
    return quaternion_to_matrix(torch.from_numpy(np.array(wxyz, dtype=np.float64))).numpy()


def matrix_to_quaternion_np(matrix: np.ndarray) -> np.ndarray:
    """``matrix_to_quaternion`` of a numpy array [..., 3, 3] -> [..., 4] (w >= 0), float64."""
    return matrix_to_quaternion(torch.from_numpy(np.array(matrix, dtype=np.float64))).numpy()
