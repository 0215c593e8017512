"""What systems hand to the exporters: meshes of NeRF fields and the space they occupy (which frames their turntables),
and everything a set of Gaussians exports."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lift3d.cameras import Cameras
from lift3d.export.backproject import RenderedColors, RenderFn
from lift3d.export.config import ExportConfig, for_device
from lift3d.export.formats import ExportSources
from lift3d.export.gaussian_density import GaussianField, GaussianTensors, gaussian_mesh_box, reaching
from lift3d.export.grid import (
    BboxLike,
    ColorFn,
    DensityFn,
    as_bbox,
    auto_threshold,
    sample_box,
    voxel_size,
)
from lift3d.export.mesh import extract_mesh
from lift3d.export.tsdf_sources import mesh_method, tsdf_builders
from lift3d.export.views import backproject_cameras
from lift3d.meshes.mesh import Mesh

log = logging.getLogger(__name__)

CONTENT_RESOLUTION = 64  # samples along the longest side of the coarse grid whose occupied points frame a field


def mesh_from_field(
    density_fn: DensityFn, bbox: BboxLike, cfg: ExportConfig, color_fn: ColorFn | None = None,
    occupancy: torch.Tensor | None = None, device: torch.device | str | None = None,
) -> Mesh:
    """A NeRF-style field's mesh with the config's options (cfg.bbox overrides ``bbox``); queries run on
    ``device`` (None: the device of ``bbox`` when it is a tensor, else the CPU)."""
    if device is None:
        device = bbox.device if isinstance(bbox, torch.Tensor) else "cpu"
    if cfg.mesh_method == "tsdf":
        raise ValueError("export.mesh_method=tsdf fuses rendered depths of Gaussian and surfel runs; a field's mesh "
                         "comes from its density: set system.export.mesh_method=density (or auto)")
    cfg = for_device(cfg, device)
    return extract_mesh(
        density_fn, cfg.bbox if cfg.bbox is not None else bbox, cfg.resolution, cfg.threshold, cfg.chunk,
        color_fn=color_fn, occupancy=occupancy if cfg.bbox is None else None, keep_components=cfg.keep_components,
        target_faces=cfg.target_faces, fill_holes=cfg.fill_holes, device=device,
    )


def field_content_points(
    density_fn: DensityFn, bbox: BboxLike, cfg: ExportConfig, occupancy: torch.Tensor | None = None,
    device: torch.device | str | None = None, resolution: int = CONTENT_RESOLUTION,
) -> Callable[[], torch.Tensor]:
    """The space a NeRF-style field occupies, as points [N, 3] that frame its turntables (``ExportSources.content_points``):
    the points of a coarse grid over the box the mesh would use (cfg.bbox, else ``bbox`` shrunk to the ``occupancy``
    grid's occupied cells) whose density exceeds the export's threshold (cfg.threshold, else chosen as for the mesh).
    An empty field gives the box's corners (the whole box is framed). Sampled once, on first need."""
    @functools.cache
    def points() -> torch.Tensor:
        density, axes, box = sample_box(density_fn, cfg.bbox if cfg.bbox is not None else bbox, resolution, cfg.chunk,
                                        occupancy if cfg.bbox is None else None, device)
        threshold = cfg.threshold
        if threshold is None:
            try:
                threshold = auto_threshold(density, float(voxel_size(axes).mean()))
            except ValueError:  # nothing opaque on the grid: frame the whole box
                threshold = float("inf")
        index = np.argwhere(density > threshold)
        if len(index) == 0:
            log.warning("the field occupies nothing of its box at density %.4g: the turntable frames the whole box", threshold)
            return torch.as_tensor(box, dtype=torch.float32)
        return torch.as_tensor(np.stack([axes[k][index[:, k]] for k in range(3)], axis=1), dtype=torch.float32)

    return points


def gaussian_color_fn(field: GaussianField, cfg: ExportConfig, render_fn: RenderFn | None = None,
                       device: torch.device | str = "cpu") -> ColorFn:
    """The Gaussians' color at points [N, 3] -> [N, 3] as their mesh is colored: their own colors
    (cfg.gaussian_colors=query, ``field.color``) or back-projected from renders around the object
    (render; the renders are made on the first call, points no view sees fall back to ``field.color``)."""
    if cfg.gaussian_colors == "query":
        return field.color
    if render_fn is None:
        raise ValueError("export.gaussian_colors=render needs the system's render function")
    cache: dict[str, ColorFn] = {}

    def rendered(points: torch.Tensor) -> torch.Tensor:
        if "fn" not in cache:
            cameras = backproject_cameras(cfg, device, lambda: field.gaussians.means)
            cache["fn"] = RenderedColors(render_fn, cameras, cfg.render_batch, fallback=field.color)
        return cache["fn"](points)

    return rendered


def gaussian_sources(
    gaussians: GaussianTensors, cfg: ExportConfig, write_3dgs_ply: Callable[[Path], Any] | None = None,
    render_fn: RenderFn | None = None, device: torch.device | str | None = None, field: GaussianField | None = None,
    gaussian_params: Callable[[], dict[str, torch.Tensor]] | None = None, antialiased: bool = False,
    own_mesh_method: str = "density", fusion_cameras: Cameras | None = None,
) -> ExportSources:
    """Everything a Gaussian system exports: the Gaussians themselves, and a mesh of their density
    colored by querying them or (cfg.gaussian_colors=render) from renders around the object.
    Queries run on ``device`` (None: where the Gaussians are); ``field``: their density field if the
    caller already built it (with cfg.gaussian_cutoff_sigma); ``gaussian_params``: the model's pre-activation
    parameters (``parameters_dict``), for the formats that keep every SH band (spz, sog, gltf-splat);
    ``antialiased``: trained with the 2D (Mip-Splatting) filter, which the .spz header records. ``own_mesh_method``:
    the mesh of export.mesh_method=auto (density, or tsdf: depths of ``render_fn`` fused over ``fusion_cameras``, the
    run's training views, or a sphere of views; colored from renders of those views)."""
    device = gaussians.means.device if device is None else torch.device(device)
    if cfg.gaussian_colors == "render" and render_fn is None:
        raise ValueError("export.gaussian_colors=render needs the system's render function")
    built: dict[str, Any] = {}  # the density field and its colors, made on first need (the Gaussian files need neither)

    def mesh_box() -> np.ndarray:
        if "box" not in built:
            built["box"] = (as_bbox(cfg.bbox) if cfg.bbox is not None
                            else gaussian_mesh_box(gaussians, cfg.gaussian_cutoff_sigma))
        return built["box"]

    def density_field() -> GaussianField:
        """The density of the Gaussians that reach the mesh's box: the mesh and its colors are only queried there."""
        if "field" not in built:
            if field is None:
                keep = reaching(gaussians, mesh_box(), cfg.gaussian_cutoff_sigma)
                kept = gaussians if bool(keep.all()) else gaussians.select(keep)
                built["field"] = GaussianField(kept, cfg.gaussian_cutoff_sigma).to(device)
            else:
                built["field"] = field.to(device)
        return built["field"]

    def color_fn(points: torch.Tensor) -> torch.Tensor:
        if "color" not in built:
            built["color"] = gaussian_color_fn(density_field(), cfg, render_fn, device)
        return built["color"](points)

    def mesh() -> Mesh:
        chosen = for_device(cfg, device)
        return extract_mesh(
            density_field().density, mesh_box(), chosen.resolution, cfg.threshold, cfg.chunk, color_fn=color_fn,
            keep_components=cfg.keep_components, target_faces=chosen.target_faces, fill_holes=cfg.fill_holes,
            opacity_scale=GaussianField.opacity_scale, device=device,
        )

    if mesh_method(cfg, own_mesh_method) == "tsdf":  # the mesh fused from rendered depths, colored from the renders
        mesh, color_fn = tsdf_builders(render_fn, cfg, device, mesh_box, lambda: gaussians.means, fusion_cameras,
                                       fallback=lambda points: density_field().color(points))
    return ExportSources(mesh=mesh, color_fn=color_fn, gaussians=gaussians, write_3dgs_ply=write_3dgs_ply,
                         gaussian_params=gaussian_params, render_fn=render_fn, device=device,
                         content_points=lambda: gaussians.means, antialiased=antialiased)
