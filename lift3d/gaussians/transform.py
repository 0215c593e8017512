"""Rigid rotations of Gaussian parameters, for file formats whose axes differ from lift3d's world.

A rotation R moves each Gaussian's mean (R mu), its orientation (q_R * q) and its view-dependent color:
the rotated Gaussian seen along d looks like the original seen along R^T d, so each SH band l gets a
(2l+1) x (2l+1) matrix (``lift3d.sh.sh_rotation``); the quaternion math is ``lift3d.rotations``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.rotations import matrix_to_quaternion, quaternion_multiply
from lift3d.sh import degree_of, sh_rotation

# A 180-degree turn about x, (x, y, z) -> (x, -y, -z): between the .ply frame (right-down-front, as
# COLMAP-trained splats are) and right-up-back, the frame SPZ stores.
FLIP_YZ = ((1.0, 0.0, 0.0), (0.0, -1.0, 0.0), (0.0, 0.0, -1.0))


def rotate_gaussians(params: dict[str, Tensor], matrix) -> dict[str, Tensor]:
    """Pre-activation parameters (``means``, ``log_scales``, ``quats`` wxyz, ``opacity_logits``, ``sh0``, ``shN``)
    of the Gaussians turned by the rotation ``matrix`` [3, 3] about the origin; scales and opacities are unchanged."""
    r = torch.as_tensor(matrix, dtype=torch.float64)
    if not torch.allclose(r @ r.T, torch.eye(3, dtype=torch.float64), atol=1e-9) or torch.linalg.det(r) < 0:
        raise ValueError("rotate_gaussians needs a proper rotation matrix (orthonormal, determinant +1)")
    means = (params["means"].double() @ r.T).to(params["means"].dtype)
    quats = quaternion_multiply(matrix_to_quaternion(r), params["quats"].double()).to(params["quats"].dtype)
    shN = params["shN"]
    if shN.shape[1]:
        x = sh_rotation(r, degree_of(shN.shape[1] + 1))[1:, 1:]
        shN = torch.einsum("jk,nkc->njc", x, shN.double()).to(shN.dtype)
    return {**params, "means": means, "quats": quats, "shN": shN}
