"""Meshes fused from rendered depths (``export.mesh_method=tsdf``) for any system that renders depth: the views, the
fusion (``lift3d.export.tsdf``), clean-up, decimation and colors back-projected from renders of the same views."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import torch

from lift3d.cameras import Cameras
from lift3d.export.backproject import RenderedColors, RenderFn
from lift3d.export.config import ExportConfig, for_device
from lift3d.export.formats import ExportSources
from lift3d.export.grid import ColorFn
from lift3d.export.mesh import decimate, keep_largest_components, remove_degenerate, with_colors
from lift3d.export.tsdf import FusedVolume, bounded_grid, contracted_grid, fuse_narrow_band, tsdf_mesh
from lift3d.export.video import framed_orbit_cameras
from lift3d.meshes.mesh import Mesh
from lift3d.progress import Stage

log = logging.getLogger(__name__)

SPHERE_ELEVATIONS = (-60.0, -30.0, 0.0, 30.0, 60.0, 85.0)  # rings of the sphere of views, in degrees


def mesh_method(cfg: ExportConfig, own: str) -> str:
    """The mesh method an export uses: ``cfg.mesh_method``, or the representation's ``own`` for auto."""
    return own if cfg.mesh_method == "auto" else cfg.mesh_method


def sphere_cameras(points: torch.Tensor, n_views: int, size: int, fovy_deg: float = 40.0,
                   device: torch.device | str = "cpu") -> Cameras:
    """``n_views`` square views of ``size`` pixels in rings from below to above the content ``points`` [N, 3], each
    ring turned half a step from the last, framed as the turntable frames them."""
    per_ring = max(1, -(-n_views // len(SPHERE_ELEVATIONS)))
    rings = [framed_orbit_cameras(points, per_ring, elevation, fovy_deg, size, size, 0.9, 180.0 * k / per_ring, device)
             for k, elevation in enumerate(SPHERE_ELEVATIONS)]
    return Cameras.cat(rings)[:n_views]


def fusion_cameras_for(cfg: ExportConfig, trained: Cameras | None, content_points: Callable[[], torch.Tensor],
                       device: torch.device | str) -> Cameras:
    """The views a TSDF export fuses: the training views (``tsdf.views`` auto or train, when the run kept them), else
    a sphere of views around the content."""
    t = cfg.tsdf
    if t.views == "train" and trained is None:
        raise ValueError("export.tsdf.views=train needs a run that kept its training views (a surfel run); "
                         "set system.export.tsdf.views=sphere")
    if t.views != "sphere" and trained is not None:
        return trained
    size = t.image_size or 2 * for_device(cfg, device).resolution
    return sphere_cameras(content_points().detach().float().cpu(), t.sphere_views, size, device=device)


def _frames(render_fn: RenderFn, cameras: Cameras, depth: str, batch: int,
            stage: Stage) -> Iterator[tuple[Cameras, torch.Tensor, torch.Tensor]]:
    warned = False
    for start in range(0, len(cameras), batch):
        view = cameras[start : start + batch]
        out = render_fn(view)
        key = "median_depth" if depth == "median" and "median_depth" in out else "depth"
        if key != "median_depth" and depth == "median" and not warned:
            log.info("the renderer gives no median depth: fusing its expected depth")
            warned = True
        yield view, out[key].detach()[..., 0], out["alpha"].detach()[..., 0]
        stage.advance(len(view))


@torch.no_grad()
def fuse_renders(render_fn: RenderFn, cameras: Cameras, box: np.ndarray, cfg: ExportConfig,
                 device: torch.device | str = "cpu") -> FusedVolume:
    """The TSDF of ``render_fn``'s depths over ``cameras``, on a grid of ``cfg.resolution`` voxels over ``box``
    [2, 3] (bounded) or over the contracted space around it."""
    t, chosen = cfg.tsdf, for_device(cfg, device)
    grid = (bounded_grid if t.space == "bounded" else contracted_grid)(box, chosen.resolution)
    with Stage(f"meshing: rendering the depths of {len(cameras)} views", len(cameras), "views") as stage:
        frames = list(_frames(render_fn, cameras, t.depth, cfg.render_batch, stage))
    with Stage(f"meshing: fusing {len(cameras)} rendered depths into a {'x'.join(map(str, grid.shape))} grid"):
        return fuse_narrow_band(grid, frames, t.truncation, device=device, min_alpha=t.min_alpha, max_depth=t.max_depth)


def tsdf_mesh_from_renders(render_fn: RenderFn, cameras: Cameras, box: np.ndarray, cfg: ExportConfig,
                           color_fn: ColorFn | None = None, device: torch.device | str = "cpu") -> Mesh:
    """The fused mesh with the export's clean-up (largest components, decimation to ``target_faces``), normals and
    vertex colors from ``color_fn``."""
    chosen = for_device(cfg, device)
    volume = fuse_renders(render_fn, cameras, box, cfg, device)
    with Stage("meshing: marching cubes, clean-up" + (f", decimation to {chosen.target_faces} faces"
                                                      if chosen.target_faces else "")):
        grid = volume.grid
        tolerance = 1e-4 * float(grid.step.min()) * (1.0 if grid.space == "bounded" else float(np.min(grid.half)))
        mesh = remove_degenerate(tsdf_mesh(volume, cfg.fill_holes), tolerance)
        if len(mesh.faces) == 0:
            raise ValueError("the fused depths hold no surface: check that the renders show the content "
                             "(system.export.tsdf.views, system.export.bbox)")
        mesh = keep_largest_components(mesh, cfg.keep_components)
        mesh = remove_degenerate(decimate(mesh, chosen.target_faces), tolerance).with_normals()
    if color_fn is not None:
        mesh = with_colors(mesh, color_fn, cfg.chunk, device)
    log.info("fused a mesh: %d vertices, %d faces from %d views", len(mesh.vertices), len(mesh.faces), len(cameras))
    return mesh


def rendered_colors(render_fn: RenderFn, cameras: Cameras, cfg: ExportConfig,
                    fallback: ColorFn | None = None) -> ColorFn:
    """Colors back-projected from renders of ``cfg.backproject_views`` of ``cameras`` spread evenly (rendered on the
    first call); points no view sees take ``fallback``."""
    made: dict[str, RenderedColors] = {}

    def colors(points: torch.Tensor) -> torch.Tensor:
        if "colors" not in made:
            pick = torch.linspace(0, len(cameras) - 1, min(cfg.backproject_views, len(cameras))).round().long()
            made["colors"] = RenderedColors(render_fn, cameras[pick.to(cameras.c2w.device)], cfg.render_batch,
                                            fallback=fallback)
        return made["colors"](points)

    return colors


def tsdf_builders(render_fn: RenderFn | None, cfg: ExportConfig, device: torch.device | str,
                  box: Callable[[], np.ndarray], content_points: Callable[[], torch.Tensor],
                  trained: Cameras | None = None,
                  fallback: ColorFn | None = None) -> tuple[Callable[[], Mesh], ColorFn]:
    """(mesh builder, color function) of a TSDF export (``ExportSources.mesh`` and ``color_fn``): ``render_fn``'s
    depths fused over the views ``fusion_cameras_for`` picks, in ``box()``, colored from renders of those views."""
    if render_fn is None:
        raise ValueError("export.mesh_method=tsdf needs the system's render function")
    made: dict[str, object] = {}

    def views() -> Cameras:
        if "views" not in made:
            made["views"] = fusion_cameras_for(cfg, trained, content_points, device)
        return made["views"]  # type: ignore[return-value]

    def color_fn(points: torch.Tensor) -> torch.Tensor:
        if "colors" not in made:
            made["colors"] = rendered_colors(render_fn, views(), cfg, fallback)
        return made["colors"](points)  # type: ignore[operator]

    return (lambda: tsdf_mesh_from_renders(render_fn, views(), box(), cfg, color_fn, device)), color_fn


def in_capture_frame(sources: ExportSources, world_from_capture: np.ndarray) -> ExportSources:
    """``sources`` whose mesh is in a capture's own frame and units: ``world_from_capture`` [4, 4] is the similarity
    (scale, rotation, translation) that the data module applied to the capture's poses; its color function takes
    points in that frame too (textures are baked at the mesh's points). Files then turn +z up to glTF's +y up as every
    mesh's do (``system.export.up_axis=z`` writes the capture's numbers as they are)."""
    matrix = np.asarray(world_from_capture, dtype=np.float64)
    if np.allclose(matrix, np.eye(4)) or sources.mesh is None:
        return sources
    scale = float(np.cbrt(np.linalg.det(matrix[:3, :3])))
    rotation, shift = matrix[:3, :3] / scale, matrix[:3, 3]
    build, color = sources.mesh, sources.color_fn

    def mesh() -> Mesh:
        world = build()
        vertices = (world.vertices.astype(np.float64) - shift) @ rotation / scale  # R^T (x - t) / s, as rows
        normals = None if world.normals is None else world.normals.astype(np.float64) @ rotation
        return replace(world, vertices=vertices.astype(np.float32),
                       normals=None if normals is None else normals.astype(np.float32))

    def color_fn(points: torch.Tensor) -> torch.Tensor:
        world = points.double() @ torch.as_tensor(rotation.T * scale, device=points.device) + torch.as_tensor(
            shift, device=points.device)
        return color(world.to(points.dtype))

    return replace(sources, mesh=mesh, color_fn=None if color is None else color_fn)
