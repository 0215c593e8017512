"""What the NeRF fields (``ImplicitVolume``, ``TriplaneField``) share: finite-difference normals."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def central_difference_normal(raw_density: Callable[[Tensor], Tensor], points: Tensor, eps: float) -> Tensor:
    """Unit normals [N, 3] = -grad(raw density) at ``points`` [N, 3] by central differences of half step ``eps``."""
    offsets = torch.eye(3, device=points.device, dtype=points.dtype) * eps
    shifted = torch.cat([points[:, None] + offsets, points[:, None] - offsets], dim=1)  # [N, 6, 3]
    values = raw_density(shifted.reshape(-1, 3)).reshape(-1, 6)
    gradient = (values[:, :3] - values[:, 3:]) / (2 * eps)
    return F.normalize(-gradient, dim=-1)
