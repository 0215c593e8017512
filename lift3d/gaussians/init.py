"""Initial Gaussian centres and colours: random in a sphere, carved by image masks, a point cloud, a mesh.

Pure functions returning ``points [N, 3]`` and ``colors [N, 3]`` in 0..1; ``knn_scales`` turns points
into initial per-Gaussian sizes (mean distance to the 3 nearest neighbours, as 3DGS).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.cameras import Cameras


def random_in_sphere(n: int, radius: float, generator: torch.Generator | None = None) -> Tensor:
    """``n`` points [n, 3] uniform in the ball of ``radius`` around the origin."""
    direction = torch.randn(n, 3, generator=generator)
    direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    r = radius * torch.rand(n, 1, generator=generator) ** (1.0 / 3.0)
    return direction * r


def visible_radius(cameras: Cameras, target: Tensor | None = None) -> float:
    """Radius of the largest ball around ``target`` (default origin) that every camera sees whole."""
    target = torch.zeros(3) if target is None else target
    distance = (cameras.positions.cpu() - target).norm(dim=-1)
    K = cameras.intrinsics.cpu()
    half_fov = torch.minimum(torch.atan(0.5 * cameras.width / K[:, 0, 0]), torch.atan(0.5 * cameras.height / K[:, 1, 1]))
    return float((distance * torch.sin(half_fov)).min())


def project_points(points: Tensor, cameras: Cameras) -> tuple[Tensor, Tensor]:
    """Pixel coordinates [C, N, 2] and camera-space depth [C, N] (positive in front) of world points."""
    w2c = cameras.w2c_opencv()
    cam = points[None] @ w2c[:, :3, :3].transpose(1, 2) + w2c[:, None, :3, 3]
    z = cam[..., 2]
    uv = (cam[..., :2] / z.clamp_min(1e-8)[..., None]) * torch.stack(
        [cameras.intrinsics[:, 0, 0], cameras.intrinsics[:, 1, 1]], -1)[:, None] + cameras.intrinsics[:, None, :2, 2]
    return uv, z


def carve_by_masks(
    cameras: Cameras, rgba: Tensor, n: int, radius: float, generator: torch.Generator | None = None,
    threshold: float = 0.5, max_rounds: int = 40,
) -> tuple[Tensor, Tensor]:
    """Points inside the visual hull of the images' alpha masks (and their mean observed colour).

    Samples the ball of ``radius`` and keeps points that every camera seeing them sees as foreground
    (alpha > threshold); ``rgba`` [C, H, W, 4] uint8 or float. Returns fewer than ``n`` points only if
    the hull is tiny after ``max_rounds`` rounds of sampling."""
    rgba = rgba.float() / 255.0 if rgba.dtype == torch.uint8 else rgba.float()
    C, H, W, _ = rgba.shape
    kept_points, kept_colors, found = [], [], 0
    for _ in range(max_rounds):
        candidates = random_in_sphere(max(4 * n, 4096), radius, generator)
        uv, z = project_points(candidates, cameras)
        col, row = uv[..., 0].floor().long(), uv[..., 1].floor().long()
        inside = (z > 0) & (col >= 0) & (col < W) & (row >= 0) & (row < H)
        flat = (torch.arange(C)[:, None] * H + row.clamp(0, H - 1)) * W + col.clamp(0, W - 1)
        samples = rgba.reshape(-1, 4)[flat]  # [C, M, 4]
        foreground = samples[..., 3] > threshold
        keep = (foreground | ~inside).all(0) & inside.any(0)
        seen = (inside & foreground).float()[..., None]
        colors = (samples[..., :3] * seen).sum(0) / seen.sum(0).clamp_min(1.0)
        kept_points.append(candidates[keep])
        kept_colors.append(colors[keep])
        found += int(keep.sum())
        if found >= n:
            break
    points, colors = torch.cat(kept_points)[:n], torch.cat(kept_colors)[:n]
    if len(points) == 0:
        raise ValueError("the image masks carve away every point: check the alpha channel, or use init: random")
    return points, colors


def knn_scales(points: Tensor, k: int = 3) -> Tensor:
    """Per-point size [N]: root mean squared distance to the ``k`` nearest other points (3DGS init)."""
    from scipy.spatial import cKDTree

    if len(points) < 2:
        return torch.full((len(points),), 0.01)
    data = points.detach().cpu().double().numpy()
    distances, _ = cKDTree(data).query(data, k=min(k, len(points) - 1) + 1)
    mean_sq = (distances[:, 1:] ** 2).mean(axis=1)
    return torch.from_numpy(np.sqrt(np.maximum(mean_sq, 1e-14))).float()


def read_point_cloud(path: str | Path) -> tuple[Tensor, Tensor]:
    """Points and colours (0..1; grey when absent) of a PLY point cloud (x, y, z[, red, green, blue])."""
    from plyfile import PlyData

    from lift3d.gaussians.ply import PlyFormatError

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"point cloud not found: {path}")
    vertex = PlyData.read(str(path))["vertex"]
    names = vertex.data.dtype.names or ()
    if not {"x", "y", "z"} <= set(names):
        raise PlyFormatError(f"{path}: a point cloud needs x, y, z vertex properties (found {', '.join(names)})")
    points = torch.from_numpy(np.stack([vertex[a] for a in "xyz"], -1).astype(np.float32))
    if {"red", "green", "blue"} <= set(names):
        rgb = np.stack([vertex[a] for a in ("red", "green", "blue")], -1).astype(np.float32)
        colors = torch.from_numpy(rgb / (255.0 if rgb.max() > 1.0 else 1.0))
    else:
        colors = torch.full_like(points, 0.5)
    return points, colors


def mesh_rotation(up_axis: str) -> np.ndarray:
    """[3, 3] turning a mesh file's ``up_axis`` to world +z: z-up files keep their frame, y-up ones turn as
    texture-mesh turns them (front +z to +x). A bad axis is a config error naming the key."""
    from lift3d.config import ConfigError
    from lift3d.meshes.io import axis_rotation

    try:
        return axis_rotation(up_axis, "+x" if up_axis.endswith("z") else "+z")
    except ValueError:
        raise ConfigError(f"system.gaussians.init_up_axis must be one of +x, -x, +y, -y, +z, -z (the mesh file's up "
                          f"axis), got {up_axis!r}") from None


def sample_mesh(path: str | Path, n: int, seed: int = 0, up_axis: str = "+y") -> tuple[Tensor, Tensor]:
    """``n`` points on a mesh surface (area-weighted), turned so the file's ``up_axis`` is world +z (the
    convention of every mesh input), with the mesh's texture or vertex colours where it has them (else grey)."""
    import trimesh

    rotation = mesh_rotation(up_axis)  # a bad axis fails before the file is read
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mesh file not found: {path}")
    mesh = trimesh.load(str(path), force="mesh")
    if len(mesh.faces) == 0:
        raise ValueError(f"{path} holds no triangles to sample")
    coloured = getattr(mesh.visual, "kind", None) in ("vertex", "texture", "face")
    try:
        sampled = trimesh.sample.sample_surface(mesh, n, seed=seed, sample_color=coloured)
    except Exception:  # a texture trimesh cannot sample (no image behind the UVs): grey, as for an uncoloured mesh
        coloured = False
        sampled = trimesh.sample.sample_surface(mesh, n, seed=seed)
    points = np.asarray(sampled[0], dtype=np.float64) @ rotation.T
    points = torch.from_numpy(points.astype(np.float32))
    if coloured and len(sampled) > 2 and sampled[2] is not None and len(sampled[2]) == n:
        colours = torch.from_numpy(np.asarray(sampled[2], dtype=np.float32)[:, :3] / 255.0)
    else:
        colours = torch.full_like(points, 0.5)
    return points, colours

