"""Initial Gaussian centers and colors: random in a sphere, carved by image masks, a point cloud, a mesh.

Pure functions returning ``points [N, 3]`` and ``colors [N, 3]`` in 0..1; ``knn_scales`` turns points
into initial per-Gaussian sizes (mean distance to the 3 nearest neighbors, as 3DGS).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.cameras import Cameras

log = logging.getLogger(__name__)


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


def hull_test(points: Tensor, cameras: Cameras, rgba: Tensor, threshold: float = 0.5,
              with_colors: bool = True) -> tuple[Tensor, Tensor | None]:
    """(inside [M] bool, colors [M, 3]) of world points [M, 3]: inside the visual hull when every camera that sees a
    point shows foreground there (alpha > ``threshold``) and one camera at least sees it; its color is the mean of the
    foreground pixels it falls on (None without ``with_colors``). ``rgba`` [C, H, W, 4] floats in 0..1."""
    C, H, W, _ = rgba.shape
    uv, z = project_points(points, cameras)
    col, row = uv[..., 0].floor().long(), uv[..., 1].floor().long()
    seen = (z > 0) & (col >= 0) & (col < W) & (row >= 0) & (row < H)
    flat = (torch.arange(C)[:, None] * H + row.clamp(0, H - 1)) * W + col.clamp(0, W - 1)
    samples = rgba.reshape(-1, 4)[flat]  # [C, M, 4]
    foreground = samples[..., 3] > threshold
    inside = (foreground | ~seen).all(0) & seen.any(0)
    if not with_colors:
        return inside, None
    weight = (seen & foreground).float()[..., None]
    return inside, (samples[..., :3] * weight).sum(0) / weight.sum(0).clamp_min(1.0)


def as_unit_rgba(rgba: Tensor) -> Tensor:
    """Float RGBA in 0..1 of uint8 (0..255) or float images."""
    return rgba.float() / 255.0 if rgba.dtype == torch.uint8 else rgba.float()


def carve_by_masks(
    cameras: Cameras, rgba: Tensor, n: int, radius: float, generator: torch.Generator | None = None,
    threshold: float = 0.5, max_rounds: int = 40,
) -> tuple[Tensor, Tensor]:
    """Points inside the visual hull of the images' alpha masks (and their mean observed color).

    Samples the ball of ``radius`` and keeps points that every camera seeing them sees as foreground
    (alpha > threshold); ``rgba`` [C, H, W, 4] uint8 or float. Returns fewer than ``n`` points only if
    the hull is tiny after ``max_rounds`` rounds of sampling."""
    rgba = as_unit_rgba(rgba)
    kept_points, kept_colors, found = [], [], 0
    for _ in range(max_rounds):
        candidates = random_in_sphere(max(4 * n, 4096), radius, generator)
        keep, colors = hull_test(candidates, cameras, rgba, threshold)
        kept_points.append(candidates[keep])
        kept_colors.append(colors[keep])
        found += int(keep.sum())
        if found >= n:
            break
    points, colors = torch.cat(kept_points)[:n], torch.cat(kept_colors)[:n]
    if len(points) == 0:
        raise ValueError("the image masks carve away every point: check the alpha channel, or use init: random")
    return points, colors


def hull_surface(
    cameras: Cameras, rgba: Tensor, n: int, radius: float, generator: torch.Generator | None = None,
    threshold: float = 0.5, resolution: int = 128, chunk: int = 1 << 16,
) -> tuple[Tensor, Tensor, Tensor]:
    """(points [n, 3], colors [n, 3], outward unit normals [n, 3]) on the surface of the visual hull of the images'
    alpha masks: surfels start where the object's surface is (or outside it, where no view carves deeper) and facing
    out, instead of filling its volume. The hull is voxelized at ``resolution`` cells across the ball of ``radius``;
    points are drawn on its boundary cells, moved onto the half level of the smoothed occupancy."""
    from scipy import ndimage

    rgba = as_unit_rgba(rgba)
    axis = torch.linspace(-radius, radius, resolution)
    centers = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), -1).reshape(-1, 3)
    occupied = torch.cat([hull_test(centers[i : i + chunk], cameras, rgba, threshold, with_colors=False)[0]
                          for i in range(0, len(centers), chunk)]) & (centers.norm(dim=-1) <= radius)
    occupied = occupied.reshape(resolution, resolution, resolution).numpy()
    boundary = occupied & ~ndimage.binary_erosion(occupied, border_value=0)
    if not boundary.any():
        raise ValueError("the image masks carve away every point: check the alpha channel, or use init: random")
    smooth = ndimage.gaussian_filter(occupied.astype(np.float32), sigma=1.0)
    gradient = np.stack(np.gradient(smooth), -1)  # per cell; the occupancy falls outward
    cells = np.argwhere(boundary)
    pick = torch.randint(len(cells), (n,), generator=generator).numpy()
    cell = cells[pick]
    step = float(axis[1] - axis[0])
    slope = gradient[tuple(cell.T)]  # [n, 3] per cell
    length = np.linalg.norm(slope, axis=-1, keepdims=True).clip(1e-6)
    normals = -slope / length
    jitter = (torch.rand(n, 3, generator=generator).numpy() - 0.5) * step
    jitter -= (jitter * normals).sum(-1, keepdims=True) * normals  # along the surface only
    # one Newton step onto the smoothed occupancy's half level, at most a cell
    shift = np.clip((smooth[tuple(cell.T)] - 0.5)[:, None] / length, -1.0, 1.0) * step
    points = torch.from_numpy(-radius + cell * step + jitter + shift * normals).float()
    colors = hull_test(points, cameras, rgba, threshold=-1.0)[1]  # every view that sees the point
    return points, colors, torch.from_numpy(normals).float()


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
    """Points and colors (0..1; gray when absent) of a PLY point cloud (x, y, z[, red, green, blue]), as tensors;
    a file without x, y, z is a ``PlyFormatError``."""
    from lift3d.data.point_cloud import read_point_cloud as read_arrays
    from lift3d.gaussians.formats.ply import PlyFormatError

    points, colors = read_arrays(path, PlyFormatError)
    return torch.from_numpy(points), torch.from_numpy(colors)


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
    convention of every mesh input), colored by what the file holds (``surface_colors``: a base-color texture
    and factor, vertex or face colors); gray where it holds no color, with a warning naming the file where a color
    it holds cannot be read."""
    import trimesh

    rotation = mesh_rotation(up_axis)  # a bad axis fails before the file is read
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"mesh file not found: {path}")
    mesh = trimesh.load(str(path), force="mesh")
    if len(mesh.faces) == 0:
        raise ValueError(f"{path} holds no triangles to sample")
    surface, face_index = trimesh.sample.sample_surface(mesh, n, seed=seed)[:2]
    try:
        colors = surface_colors(mesh, np.asarray(surface, np.float64), np.asarray(face_index, np.int64))
    except Exception as error:  # noqa: BLE001  (a material trimesh reads but lift3d cannot use: gray, said aloud)
        log.warning("the colors of %s could not be read (%s: %s); the Gaussians start gray", path, type(error).__name__,
                    str(error).splitlines()[0] if str(error) else "no message")
        colors = None
    if colors is None:
        log.info("%s holds no colors (no texture, material color or vertex colors); the Gaussians start gray", path)
        colors = np.full((n, 3), 0.5, np.float32)
    points = np.asarray(surface, dtype=np.float64) @ rotation.T
    return torch.from_numpy(points.astype(np.float32)), torch.from_numpy(np.ascontiguousarray(colors, np.float32))


def surface_colors(mesh, points: np.ndarray, face_index: np.ndarray) -> np.ndarray | None:
    """Colors [n, 3] in 0..1 of a trimesh mesh at surface ``points`` [n, 3] on faces ``face_index`` [n]: a texture
    visual's base-color image (PBR ``baseColorTexture`` or a simple material's ``image``, at the points' UVs) times its
    base-color factor (PBR ``baseColorFactor``; a simple material without an image: its ``diffuse``), or vertex
    colors (interpolated) or face colors. None when the mesh holds no color; errors say what could not be read."""
    import trimesh

    visual = mesh.visual
    kind = getattr(visual, "kind", None)
    faces = np.asarray(mesh.faces)[face_index]
    if kind == "vertex":
        bary = trimesh.triangles.points_to_barycentric(np.asarray(mesh.vertices)[faces], points)
        vertex = np.asarray(visual.vertex_colors, np.float32)[:, :3] / 255.0
        return np.clip((vertex[faces] * bary[:, :, None]).sum(axis=1), 0.0, 1.0)
    if kind == "face":
        return np.asarray(visual.face_colors, np.float32)[face_index, :3] / 255.0
    material = getattr(visual, "material", None)
    if material is None:
        return None
    image, factor = material_base_color(material)
    if image is None:
        if factor is None:
            raise ValueError(f"its material ({type(material).__name__}) has neither a base-color image nor a color")
        return np.broadcast_to(factor, (len(points), 3)).copy()
    uv = getattr(visual, "uv", None)
    if uv is None or len(uv) != len(mesh.vertices):
        raise ValueError(f"its material has a base-color image but the mesh has no texture coordinates (uv: "
                         f"{None if uv is None else len(uv)} for {len(mesh.vertices)} vertices)")
    bary = trimesh.triangles.points_to_barycentric(np.asarray(mesh.vertices)[faces], points)
    uvs = (np.asarray(uv, np.float64)[faces] * bary[:, :, None]).sum(axis=1)
    colors = sample_image(image, uvs)
    return colors if factor is None else colors * factor


def material_base_color(material) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(image [H, W, 3] float in 0..1 or None, factor [3] in 0..1 or None) of a trimesh material: PBR's
    ``baseColorTexture`` and ``baseColorFactor``, a simple material's ``image`` (or, without one, its ``diffuse``)."""
    from PIL import Image

    image = getattr(material, "baseColorTexture", None)
    factor = getattr(material, "baseColorFactor", None)
    if image is None and factor is None:  # SimpleMaterial (OBJ/MTL): its map_Kd, else its Kd
        image = getattr(material, "image", None)
        factor = None if image is not None else getattr(material, "diffuse", None)
    if image is not None:
        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image))
        image = np.asarray(image.convert("RGB"), np.float32) / 255.0
    if factor is not None:
        raw = np.asarray(factor)
        factor = raw.astype(np.float32).reshape(-1)[:3]
        factor = factor / 255.0 if raw.dtype.kind in "ui" or factor.max() > 1.0 else factor  # trimesh keeps uint8 RGBA
    return image, factor


def sample_image(image: np.ndarray, uvs: np.ndarray) -> np.ndarray:
    """Nearest texels [n, 3] of ``image`` [H, W, 3] at ``uvs`` [n, 2] (u right, v up, the origin at the image's
    bottom-left; coordinates outside 0..1 repeat, as glTF's default sampler does)."""
    h, w = image.shape[:2]
    uvs = np.mod(uvs, 1.0)
    col = np.clip((uvs[:, 0] * w).astype(np.int64), 0, w - 1)
    row = np.clip(((1.0 - uvs[:, 1]) * h).astype(np.int64), 0, h - 1)
    return image[row, col, :3]
