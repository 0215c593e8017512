"""Pure camera math of the viewer: viser's browser camera <-> lift3d cameras, and camera-path interpolation.

viser reports a camera as ``wxyz`` and ``position`` with ``P_world = R(wxyz) p_camera + position`` in OpenCV camera
axes (x right, y down, looking down +z) and ``fov`` as the vertical field of view in radians; lift3d's ``c2w`` uses
OpenGL camera axes (x right, y up, looking down -z). Quaternions are wxyz throughout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lift3d.cameras import Cameras, intrinsics_from_fovy, normalize
from lift3d.rotations import matrix_to_quaternion, quaternion_to_matrix
from lift3d.rotations import slerp as batched_slerp

_FLIP_YZ = torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))


def _as_tensor(values: Sequence[float] | Tensor) -> Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def viser_pose_to_c2w(wxyz: Sequence[float] | Tensor, position: Sequence[float] | Tensor) -> Tensor:
    """lift3d c2w [4, 4] (OpenGL axes, float64) of a viser camera pose (OpenCV axes)."""
    c2w = torch.eye(4, dtype=torch.float64)
    c2w[:3, :3] = quaternion_to_matrix(_as_tensor(wxyz)) @ _FLIP_YZ
    c2w[:3, 3] = _as_tensor(position)
    return c2w


def c2w_to_viser_pose(c2w: Tensor) -> tuple[Tensor, Tensor]:
    """(wxyz [4], position [3]) of a lift3d c2w [4, 4] for viser's scene nodes (frustums, cameras)."""
    c2w = _as_tensor(c2w)
    return matrix_to_quaternion(c2w[:3, :3] @ _FLIP_YZ), c2w[:3, 3].clone()


def render_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """(width, height) of the browser's canvas aspect with the longest side ``max_side`` (at least 1x1; a canvas
    not yet measured, 0x0, renders square)."""
    if width <= 0 or height <= 0:
        return max_side, max_side
    scale = max_side / max(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def viewer_cameras(c2w: Tensor, fovy: float, width: int, height: int) -> Cameras:
    """One lift3d camera (float32) at ``c2w`` [4, 4] with vertical field of view ``fovy`` (radians), centered, square pixels."""
    intrinsics = intrinsics_from_fovy(torch.tensor([fovy]), width, height)
    return Cameras(_as_tensor(c2w).float()[None], intrinsics, width, height)


def slerp(q0: Tensor, q1: Tensor, t: float) -> Tensor:
    """Spherical linear interpolation of two unit quaternions (wxyz) along the shorter arc; t in [0, 1]."""
    q0, q1 = normalize(_as_tensor(q0)), normalize(_as_tensor(q1))
    return batched_slerp(q0[None], q1[None], torch.tensor([float(t)], dtype=q0.dtype))[0]


def catmull_rom(p0: Tensor, p1: Tensor, p2: Tensor, p3: Tensor, t: float) -> Tensor:
    """The uniform Catmull-Rom spline between ``p1`` (t=0) and ``p2`` (t=1), shaped by neighbors ``p0`` and ``p3``."""
    return 0.5 * (2 * p1 + (p2 - p0) * t + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t**2 + (3 * p1 - p0 - 3 * p2 + p3) * t**3)


def interpolate_path(c2w: Tensor, fovy: Tensor, n_frames: int, interpolation: str = "spline") -> tuple[Tensor, Tensor]:
    """``n_frames`` cameras through keyframes ``c2w`` [K, 4, 4] with fields of view ``fovy`` [K] (radians), the
    keyframes evenly spaced in time (the first frame at the first keyframe, the last at the last): positions on a
    Catmull-Rom spline (``spline``) or straight lines (``linear``), rotations by slerp, fields of view linearly.
    Returns (c2w [n_frames, 4, 4], fovy [n_frames]), float64."""
    if interpolation not in ("spline", "linear"):
        raise ValueError(f"interpolation must be spline or linear, got {interpolation!r}")
    c2w, fovy = _as_tensor(c2w), _as_tensor(fovy)
    k = c2w.shape[0]
    if k < 1 or n_frames < 1:
        raise ValueError(f"a camera path needs at least one keyframe and one frame, got {k} and {n_frames}")
    positions = c2w[:, :3, 3]
    quats = matrix_to_quaternion(c2w[:, :3, :3])
    out_c2w = torch.zeros(n_frames, 4, 4, dtype=torch.float64)
    out_fovy = torch.zeros(n_frames, dtype=torch.float64)
    for i in range(n_frames):
        u = 0.0 if n_frames == 1 else i / (n_frames - 1) * (k - 1)
        seg = min(int(u), max(k - 2, 0))
        t = u - seg
        nxt = min(seg + 1, k - 1)
        if interpolation == "spline" and k > 2:
            before, after = positions[max(seg - 1, 0)], positions[min(seg + 2, k - 1)]
            # at the ends the missing neighbor is mirrored, so the spline leaves the end keyframe towards the next
            if seg == 0:
                before = 2 * positions[0] - positions[1]
            if seg + 2 > k - 1:
                after = 2 * positions[k - 1] - positions[k - 2]
            position = catmull_rom(before, positions[seg], positions[nxt], after, t)
        else:
            position = positions[seg] + (positions[nxt] - positions[seg]) * t
        out_c2w[i, :3, :3] = quaternion_to_matrix(slerp(quats[seg], quats[nxt], t))
        out_c2w[i, :3, 3] = position
        out_c2w[i, 3, 3] = 1.0
        out_fovy[i] = fovy[seg] + (fovy[nxt] - fovy[seg]) * t
    return out_c2w, out_fovy


def normals_from_depth(depth: Tensor, cameras: Cameras) -> Tensor:
    """World-space unit normals [B, H, W, 3] of the surface a depth map [B, H, W, 1] (distance along the camera's
    -z axis) shows, from the cross product of neighboring back-projected points; for renderers without normals."""
    b, h, w = depth.shape[:3]
    j, i = torch.meshgrid(torch.arange(h, dtype=depth.dtype, device=depth.device) + 0.5,
                          torch.arange(w, dtype=depth.dtype, device=depth.device) + 0.5, indexing="ij")
    k = cameras.intrinsics.to(depth)
    fx, fy, cx, cy = (k[:, 0, 0, None, None], k[:, 1, 1, None, None], k[:, 0, 2, None, None], k[:, 1, 2, None, None])
    z = depth[..., 0]
    points = torch.stack([(i - cx) / fx * z, -(j - cy) / fy * z, -z], dim=-1)  # camera space, OpenGL axes
    dx = torch.zeros_like(points)
    dy = torch.zeros_like(points)
    dx[:, :, :-1] = points[:, :, 1:] - points[:, :, :-1]
    dx[:, :, -1] = dx[:, :, -2] if w > 1 else 0
    dy[:, :-1] = points[:, 1:] - points[:, :-1]
    dy[:, -1] = dy[:, -2] if h > 1 else 0
    normal_cam = normalize(torch.cross(dy, dx, dim=-1))  # image x right, image y down: dy x dx faces the camera
    rotation = cameras.c2w[:, :3, :3].to(depth)
    return torch.einsum("bij,bhwj->bhwi", rotation, normal_cam)
