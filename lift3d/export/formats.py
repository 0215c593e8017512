"""The table of export formats and ``export_formats``, which writes those asked for from what a system can provide
(see ``lift3d.export``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lift3d.aftercare import WriterUnavailable, attempt, require_ffmpeg, require_webp
from lift3d.export.backproject import RenderFn
from lift3d.export.catalog import FORMATS
from lift3d.export.config import DEVICE_DEFAULTS, ExportConfig, for_device
from lift3d.export.gaussian_density import GaussianTensors
from lift3d.export.grid import ColorFn
from lift3d.export.html import write_html
from lift3d.export.mesh import Mesh, decimated_to
from lift3d.export.naming import export_name
from lift3d.export.texture import bake_texture
from lift3d.export.video import render_frames
from lift3d.export.views import framing_points, turntable_cameras
from lift3d.export.writers import write_glb, write_obj, write_ply
from lift3d.gaussians.formats.gltf import save_gltf_splat
from lift3d.gaussians.formats.ksplat import save_ksplat
from lift3d.gaussians.formats.sog import save_sog
from lift3d.gaussians.formats.sog_lod import save_sog_lod
from lift3d.gaussians.formats.splat import write_splat
from lift3d.gaussians.formats.spz import save_spz
from lift3d.saving import OutputSaver

log = logging.getLogger(__name__)

# format -> what its writer needs beyond lift3d's own dependencies: a check raising WriterUnavailable (``lift3d info``)
FORMAT_NEEDS: dict[str, Callable[[], None]] = {"mp4": require_ffmpeg, "sog": require_webp, "sog-lod": require_webp}


def format_status() -> dict[str, str]:
    """Every export format of FORMATS: "ok" or what its writer is missing and how to install it (``lift3d info``)."""
    status = {}
    for name in FORMATS:
        try:
            FORMAT_NEEDS.get(name, lambda: None)()
            status[name] = "ok"
        except WriterUnavailable as error:
            status[name] = str(error)
    return status


# format -> writer(path, params, keep=mask, sh_degree=int); file names from lift3d.export.naming
COMPACT_WRITERS: dict[str, Callable[..., Path]] = {"spz": save_spz, "sog": save_sog, "gltf-splat": save_gltf_splat,
                                                   "ksplat": save_ksplat, "sog-lod": save_sog_lod}


class ExportFormatError(ValueError):
    """A format name lift3d does not know, or one this run cannot make; the message lists the ones it can."""


MESH_FORMATS, VIDEO_FORMATS = {"glb", "obj", "mesh-ply"}, {"mp4", "gif"}
FORMATS_USING = {"resolution": MESH_FORMATS, "target_faces": MESH_FORMATS, "video_frames": VIDEO_FORMATS,
                 "video_fps": VIDEO_FORMATS,
                 "video_width": VIDEO_FORMATS, "video_height": VIDEO_FORMATS}



@dataclass
class ExportSources:
    """What a system can hand to the exporters; leave out what it cannot (its formats are refused)."""

    mesh: Callable[[], Mesh] | None = None  # builds the (vertex-colored) mesh; called at most once, only if needed
    color_fn: ColorFn | None = None  # albedo at points [N, 3] -> [N, 3], baked into textures
    gaussians: GaussianTensors | None = None  # activated Gaussians with colors, for .splat
    write_3dgs_ply: Callable[..., Any] | None = None  # the model's 3DGS .ply writer: (path, keep=mask, sh_degree=int)
    # pre-activation parameters, every SH band (spz, sog, gltf-splat)
    gaussian_params: Callable[[], dict[str, torch.Tensor]] | None = None
    render_fn: RenderFn | None = None  # cameras -> renderer outputs, for turntables
    content_points: Callable[[], torch.Tensor] | None = None  # points [N, 3] whose bounds frame turntables (None: the mesh's)
    device: torch.device | str = "cpu"  # where queries run
    file_frame: Any = None  # a user's mesh (lift3d.meshes.io.FileFrame): mesh files go back into its coordinates
    antialiased: bool = False  # Gaussians trained with the 2D (Mip-Splatting) filter: the .spz header's flag
    # the Gaussians' axes: "world" (lift3d's, +z up: a run's) or "ply" (a converted file's own, the 3DGS .ply frame);
    # the glTF writer turns each into glTF's +y up
    gaussian_axes: str = "world"
    # the mesh comes whole (a mesh stage's DMTet surface), not meshed to export.target_faces: decimated to it here
    mesh_to_budget: bool = False

    def provides(self) -> list[str]:
        return [name for name, (need, _) in FORMATS.items() if getattr(self, need) is not None]


def check_formats(formats: Sequence[str], sources: ExportSources) -> list[str]:
    """The formats in order without repeats; unknown or unavailable ones are errors that list the valid."""
    out: list[str] = []
    for fmt in formats:
        fmt = str(fmt).lower().lstrip(".")
        if fmt == "ply":
            raise ExportFormatError("format 'ply' is ambiguous: use mesh-ply (a mesh with vertex colors) or 3dgs-ply "
                                    "(3D Gaussians)")
        if fmt not in FORMATS:
            known = ", ".join(f"{k} ({v[1]})" for k, v in FORMATS.items())
            raise ExportFormatError(f"unknown export format {fmt!r}; known formats: {known}")
        if getattr(sources, FORMATS[fmt][0]) is None:
            can = ", ".join(sources.provides()) or "nothing"
            raise ExportFormatError(f"this run cannot export {fmt!r} ({FORMATS[fmt][1]}); it can export: {can}")
        if fmt not in out:
            out.append(fmt)
    return out


def export_formats(saver: OutputSaver, formats: Sequence[str], cfg: ExportConfig, sources: ExportSources,
                   stem: str = "model") -> list[Path]:
    """Write each of ``formats`` under ``saver`` as ``<stem>.<ext>`` (cfg.stem wins when set); returns
    every file written. The mesh is built once and textured once, whatever the number of mesh formats."""
    formats = check_formats(formats, sources)
    chosen = for_device(cfg, sources.device)
    automatic = [f"{name}={getattr(chosen, name)}" for name in DEVICE_DEFAULTS if getattr(cfg, name) is None
                 and (FORMATS_USING[name] & set(formats))]
    if automatic and torch.device(sources.device).type == "cpu":
        log.info("exporting on the CPU with %s (set system.export.NAME=VALUE to change)", ", ".join(automatic))
    cfg = chosen
    stem = cfg.stem or stem
    written: list[Path] = []
    cache: dict[str, Any] = {}  # the mesh, its textured copy and the Gaussians kept: each made once

    def mesh() -> Mesh:
        if "mesh" not in cache:
            cache["mesh"] = sources.mesh()
            if sources.mesh_to_budget:
                cache["mesh"] = decimated_to(cache["mesh"], cfg.target_faces, sources.color_fn, cfg.chunk, sources.device)
        return cache["mesh"]

    def mesh_for_files() -> Mesh:
        """Textured when a color field and a texture size are given, else the vertex-colored mesh."""
        if sources.color_fn is None or cfg.texture_size <= 0:
            return mesh()
        if "textured" not in cache:
            cache["textured"] = bake_texture(mesh(), sources.color_fn, cfg.texture_size, cfg.texture_padding,
                                             chunk=cfg.chunk, device=sources.device)
        return cache["textured"]

    frames: list = []

    def kept_gaussians() -> torch.Tensor | None:
        """The Gaussians the files keep (None: all), by the export's opacity floor and count cap; chosen once."""
        if "keep" not in cache and sources.gaussians is not None:
            cache["keep"] = gaussian_keep_mask(sources.gaussians, cfg.min_opacity, cfg.max_gaussians)
        return cache.get("keep")

    frame = sources.file_frame
    up_axis = "z" if frame is not None else cfg.up_axis  # in the user's file frame, the coordinates are final

    def placed(m: Mesh) -> Mesh:
        """The mesh as written: in the user's file's coordinates when it came from their file."""
        if frame is None:
            return m
        normals = None if m.normals is None else frame.directions_to_file(m.normals)
        return Mesh(frame.to_file(m.vertices), m.faces, m.vertex_colors, normals, m.uvs, m.texture)

    def write(fmt: str) -> list[Path]:
        path = saver.path(export_name(stem, fmt))
        if fmt == "glb":
            return write_glb(placed(mesh_for_files()), path, up_axis)
        if fmt == "obj":
            return write_obj(placed(mesh_for_files()), path, up_axis)
        if fmt == "mesh-ply":
            return write_ply(placed(mesh()), path, up_axis)
        if fmt == "3dgs-ply":
            degree = cfg.gaussian_sh_degree if cfg.gaussian_sh_degree >= 0 else None
            sources.write_3dgs_ply(path, keep=kept_gaussians(), sh_degree=degree)
            return [path]
        if fmt == "html":
            keep = kept_gaussians()
            return write_html(path, sources.gaussians if keep is None else sources.gaussians.select(keep), title=stem,
                              elevation_deg=cfg.video_elevation_deg)
        if fmt == "splat":
            keep = kept_gaussians()
            return write_splat(path, sources.gaussians if keep is None else sources.gaussians.select(keep))
        if fmt in COMPACT_WRITERS:
            degree = cfg.gaussian_sh_degree if cfg.gaussian_sh_degree >= 0 else None
            gltf_axes = up_axis if up_axis == "z" else ("world" if sources.gaussian_axes == "world" else "y")
            options = {"gltf-splat": {"up_axis": gltf_axes}, "sog": {"sh_palette": cfg.sog_sh_palette},
                       "spz": {"version": cfg.spz_version, "antialiased": sources.antialiased},
                       "sog-lod": {"levels": cfg.lod_levels, "sh_palette": cfg.sog_sh_palette}}.get(fmt, {})
            return [COMPACT_WRITERS[fmt](path, sources.gaussian_params(), keep=kept_gaussians(), sh_degree=degree, **options)]
        if not frames:  # mp4 and gif share one turntable render
            framing = framing_points(sources.content_points, mesh if sources.mesh is not None else None)
            cameras = turntable_cameras(cfg, framing, cfg.video_frames, cfg.video_elevation_deg, device=sources.device)
            frames.extend(render_frames(sources.render_fn, cameras, cfg.render_batch))
        return [saver.video(path.name, frames, fps=cfg.video_fps)]

    for fmt in formats:  # each format succeeds or warns on its own: one missing writer does not cost the others
        paths = attempt(f"the {fmt} export", write, fmt) or []
        for path in paths:
            log.info("exported %s", path)
        written += paths
    return written


def gaussian_keep_mask(gaussians: GaussianTensors, min_opacity: float, max_count: int) -> torch.Tensor | None:
    """[N] bool: Gaussians at least ``min_opacity`` opaque, at most ``max_count`` of them (the most visible by
    volume x opacity, as .splat orders them); None when both are off. Logged, so a smaller file says why."""
    if min_opacity <= 0 and max_count <= 0:
        return None
    opacities = gaussians.opacities.detach().reshape(-1).float().cpu()
    keep = opacities >= min_opacity
    if 0 < max_count < int(keep.sum()):
        importance = gaussians.scales.detach().float().cpu().prod(dim=-1) * opacities
        importance[~keep] = -1.0
        top = torch.topk(importance, max_count).indices
        keep = torch.zeros_like(keep)
        keep[top] = True
    log.info("Gaussian files keep %d of %d Gaussians (opacity >= %g, at most %s)", int(keep.sum()), len(keep), min_opacity,
             max_count or "all")
    return keep
