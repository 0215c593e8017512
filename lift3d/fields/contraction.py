"""Scene contraction for unbounded scenes (Mip-NeRF 360, nerfacto): all of space squeezed into a cube.

Points are measured in units of the field's box (its center at 0, its faces at +-1). Inside the box they
stay where they are; outside, ``y -> (2 - 1/|y|) y / |y|`` pulls them into the shell between the box and
twice its size, so infinity lands on the shell's outer face. ``cube`` uses the max norm (nerfacto: the
whole cube [-2, 2]^3 is used, so a grid over it wastes no cells); ``sphere`` the Euclidean norm (Mip-NeRF
360: the ball of radius 2). ``to_unit_cube`` and ``from_unit_cube`` map world points to and from the
[0, 1]^3 coordinates hash grids and occupancy grids index, with or without contraction.
"""

from __future__ import annotations

import torch
from torch import Tensor

CONTRACTIONS = ("none", "cube", "sphere")
_EDGE = 1e-3  # from_unit_cube keeps contracted norms this far inside 2 (their preimage is then ~1000 box units away)


def _norm(y: Tensor, kind: str) -> Tensor:
    return y.abs().amax(dim=-1, keepdim=True) if kind == "cube" else y.norm(dim=-1, keepdim=True)


def contract(y: Tensor, kind: str) -> Tensor:
    """Contracted coordinates [..., 3] (inside the 2-cube or 2-ball) of points ``y`` [..., 3] in box units."""
    if kind == "none":
        return y
    n = _norm(y, kind).clamp_min(1e-12)
    return torch.where(n <= 1, y, (2 - 1 / n) * y / n)


def uncontract(z: Tensor, kind: str) -> Tensor:
    """Points in box units [..., 3] whose contraction is ``z`` [..., 3] (norms clamped just inside 2)."""
    if kind == "none":
        return z
    m = _norm(z, kind).clamp(1e-12, 2 - _EDGE)
    return torch.where(m <= 1, z, z / (m * (2 - m)))


def check_contraction(kind: str) -> None:
    if kind not in CONTRACTIONS:
        raise ValueError(f"field contraction must be one of {', '.join(CONTRACTIONS)}, got '{kind}'")


def to_unit_cube(points: Tensor, bbox: Tensor, kind: str = "none") -> Tensor:
    """World points [N, 3] -> [0, 1]^3 coordinates: the box ``bbox`` [2, 3] itself (``none``), or the
    contracted space around it, where the box fills the middle half of each axis."""
    if kind == "none":
        return (points - bbox[0]) / (bbox[1] - bbox[0])
    center, half = 0.5 * (bbox[0] + bbox[1]), 0.5 * (bbox[1] - bbox[0])
    return (contract((points - center) / half, kind) + 2) / 4


def from_unit_cube(unit: Tensor, bbox: Tensor, kind: str = "none") -> Tensor:
    """The inverse of ``to_unit_cube``: [0, 1]^3 coordinates [N, 3] -> world points [N, 3]."""
    if kind == "none":
        return bbox[0] + unit * (bbox[1] - bbox[0])
    center, half = 0.5 * (bbox[0] + bbox[1]), 0.5 * (bbox[1] - bbox[0])
    return center + uncontract(unit * 4 - 2, kind) * half
