"""``export_formats``: write the formats asked for from what a system can provide (see ``lift3d.export``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lift3d.aftercare import WriterUnavailable, attempt, require_ffmpeg, require_webp
from lift3d.export.backproject import RenderedColours, RenderFn
from lift3d.export.gaussian_density import GaussianField, GaussianTensors, gaussian_mesh_box, reaching
from lift3d.export.grid import BboxLike, ColourFn, DensityFn, as_bbox
from lift3d.export.html import write_html
from lift3d.export.mesh import Mesh, extract_mesh
from lift3d.export.naming import export_name
from lift3d.export.texture import bake_texture
from lift3d.export.video import framed_orbit_cameras, orbit_cameras, render_frames
from lift3d.export.writers import write_glb, write_obj, write_ply
from lift3d.gaussians.formats.gltf import save_gltf_splat
from lift3d.gaussians.formats.ksplat import save_ksplat
from lift3d.gaussians.formats.sog import save_sog
from lift3d.gaussians.formats.sog_lod import save_sog_lod
from lift3d.gaussians.formats.splat import write_splat
from lift3d.gaussians.formats.spz import save_spz
from lift3d.saving import OutputSaver

log = logging.getLogger(__name__)

# format name -> (what it needs, what it is)
FORMATS: dict[str, tuple[str, str]] = {
    "glb": ("mesh", "binary glTF mesh, albedo texture embedded (vertex colours when texture_size=0)"),
    "obj": ("mesh", "Wavefront .obj + .mtl + texture .png"),
    "mesh-ply": ("mesh", ".ply mesh with vertex colours"),
    "3dgs-ply": ("write_3dgs_ply", "3D Gaussians in the 3DGS .ply layout"),
    "splat": ("gaussians", "3D Gaussians in the compact .splat layout"),
    "html": ("gaussians", "one self-contained web page showing the Gaussians (WebGL, orbit controls, works offline)"),
    "spz": ("gaussian_params", "3D Gaussians in Niantic's compressed .spz (SH bands kept)"),
    "sog": ("gaussian_params", "3D Gaussians in PlayCanvas's .sog bundle (WebP-quantised, SH palette)"),
    "gltf-splat": ("gaussian_params", "3D Gaussians in glTF (-gaussians.glb) with KHR_gaussian_splatting"),
    "ksplat": ("gaussian_params", "3D Gaussians in GaussianSplats3D's .ksplat (16-bit, SH bands up to 2)"),
    "sog-lod": ("gaussian_params", "levels of detail as PlayCanvas's streamed SOG (-lod/lod-meta.json, a SOG per level)"),
    "mp4": ("render_fn", "turntable video (H.264)"),
    "gif": ("render_fn", "turntable animation"),
}

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


# field -> (on a GPU, on the CPU): what an ExportConfig field left at None takes where the export runs. The CPU values
# keep a 45k-Gaussian export to every format within minutes on two cores: the density grid costs resolution^3, the UV
# atlas grows with the faces, and a turntable frame costs a full CPU rasterization.
DEVICE_DEFAULTS: dict[str, tuple[int, int]] = {
    "resolution": (256, 128), "target_faces": (100000, 50000), "video_frames": (120, 60), "video_fps": (30, 20),
    "video_width": (512, 384), "video_height": (512, 384),
}

MESH_FORMATS, VIDEO_FORMATS = {"glb", "obj", "mesh-ply"}, {"mp4", "gif"}
FORMATS_USING = {"resolution": MESH_FORMATS, "target_faces": MESH_FORMATS, "video_frames": VIDEO_FORMATS, "video_fps": VIDEO_FORMATS,
                 "video_width": VIDEO_FORMATS, "video_height": VIDEO_FORMATS}


def for_device(cfg: ExportConfig, device: torch.device | str) -> ExportConfig:
    """``cfg`` with its automatic (None) fields of DEVICE_DEFAULTS set for an export on ``device``."""
    on_cpu = torch.device(device).type == "cpu"
    chosen = {name: values[on_cpu] for name, values in DEVICE_DEFAULTS.items() if getattr(cfg, name) is None}
    return replace(cfg, **chosen) if chosen else cfg


@dataclass
class ExportConfig:
    """How assets are exported; systems embed it as ``export`` in their config."""

    formats: list = field(default_factory=lambda: ["glb"])  # formats written when `lift3d export` gets no --format
    stem: str = ""  # file-name stem of the exports ("": it<step>)
    resolution: int | None = None  # mesh: marching-cubes samples along the longest side of the box (None: DEVICE_DEFAULTS)
    threshold: float | None = None  # mesh: density iso-level (None: automatic, Otsu on voxel opacity, logged)
    bbox: list | None = None  # mesh: [[x0, y0, z0], [x1, y1, z1]] to mesh (None: the representation's own box)
    fill_holes: bool = True  # mesh: fill enclosed empty pockets, so shells mesh as one outer surface
    keep_components: int = 1  # mesh: keep the k largest connected parts (0: all)
    target_faces: int | None = None  # mesh: decimate to about this many faces (0: off; None: DEVICE_DEFAULTS)
    texture_size: int = 1024  # mesh: side of the baked albedo texture (0: vertex colours in .glb/.obj)
    texture_padding: int = 2  # mesh: texels between UV charts
    up_axis: str = "y"  # mesh files: y (glTF/Blender convention; converted from lift3d's +z up) or z (as is)
    chunk: int = 262144  # points per density or colour query
    gaussian_cutoff_sigma: float = 3.0  # Gaussians: each reaches this many standard deviations when meshed
    gaussian_colours: str = "query"  # Gaussians' mesh colours: query (their own colours) or render (back-projected)
    backproject_views: int = 16  # render colours: views around the object (half at +30 deg, half at -15 deg)
    video_frames: int | None = None  # turntable: frames in a full turn (None: DEVICE_DEFAULTS)
    video_fps: int | None = None  # turntable: frames per second (None: DEVICE_DEFAULTS)
    video_elevation_deg: float = 15.0  # turntable: camera elevation above the xy-plane
    video_framing: str = "content"  # turntable: content (orbit the content's centre, its bounds in view) or fixed
    video_fill: float = 0.9  # turntable, framing=content: share of the frame's half-height the content's bounds span
    video_distance: float = 3.0  # turntable: camera distance from the origin (framing=fixed, or a run without content points)
    video_fovy_deg: float = 40.0  # turntable: vertical field of view
    video_width: int | None = None  # turntable: frame width in pixels (None: DEVICE_DEFAULTS)
    video_height: int | None = None  # turntable: frame height in pixels (None: DEVICE_DEFAULTS)
    render_batch: int = 4  # views per render call (turntable and back-projection)
    gaussian_min_opacity: float = 0.0  # Gaussian files (3dgs-ply, splat, spz, sog, gltf-splat): drop Gaussians fainter than this (0: keep all)
    gaussian_max_count: int = 0  # Gaussian files: keep at most this many, the most visible (volume x opacity; 0: all)
    gaussian_sh_degree: int = -1  # 3dgs-ply, spz, sog, gltf-splat: SH bands up to this degree (-1: all; 0 makes the file about 4x smaller)
    sog_sh_palette: int = 0  # sog: entries of the SH palette (k-means of the higher bands; 0: a power of two near N / 16)
    spz_version: int = 4  # spz: 4 (ZSTD streams, Niantic's current) or 3 (one gzip stream, for readers that predate 4)
    lod_levels: int = 3  # sog-lod: levels of detail (each coarser one merges neighbouring Gaussians in pairs: about half)

    def __post_init__(self) -> None:
        """Sizes and counts that no export can use are refused when the system is built, not after training."""
        from lift3d.config_checks import check_minimums
        from lift3d.export.video import check_video_size

        check_minimums("system.export", self, {
            "resolution": (2, 256), "chunk": (8, 262144), "video_frames": (1, 120), "video_fps": (1, 30),
            "render_batch": (1, 4), "backproject_views": (1, 16), "texture_size": (0, 1024), "texture_padding": (0, 2),
            "target_faces": (0, 100000), "keep_components": (0, 1), "gaussian_max_count": (0, 0),
            "gaussian_sh_degree": (0, -1, (-1,)), "sog_sh_palette": (0, 0), "gaussian_min_opacity": (0.0, 0.0),
        })
        width, height = (DEVICE_DEFAULTS[k][0] if v is None else v for k, v in (("video_width", self.video_width),
                                                                               ("video_height", self.video_height)))
        check_video_size(width, height, "system.export.video_width", "system.export.video_height")
        from lift3d.config import ConfigError

        if self.video_framing not in ("content", "fixed"):
            raise ConfigError(f"system.export.video_framing must be content or fixed, got {self.video_framing!r}")
        if not 0.0 < self.video_fill <= 1.0:
            raise ConfigError(f"system.export.video_fill must be in (0, 1] (a share of the frame), got {self.video_fill}")
        if self.spz_version not in (3, 4):
            raise ConfigError(f"system.export.spz_version must be 4 or 3 (for readers that predate 4), got {self.spz_version!r}")
        if self.lod_levels < 1:
            raise ConfigError(f"system.export.lod_levels must be at least 1 (level 0 is the Gaussians), got {self.lod_levels}")


@dataclass
class ExportSources:
    """What a system can hand to the exporters; leave out what it cannot (its formats are refused)."""

    mesh: Callable[[], Mesh] | None = None  # builds the (vertex-coloured) mesh; called at most once, only if needed
    colour_fn: ColourFn | None = None  # albedo at points [N, 3] -> [N, 3], baked into textures
    gaussians: GaussianTensors | None = None  # activated Gaussians with colours, for .splat
    write_3dgs_ply: Callable[..., Any] | None = None  # the model's 3DGS .ply writer: (path, keep=mask, sh_degree=int)
    gaussian_params: Callable[[], dict[str, torch.Tensor]] | None = None  # pre-activation parameters, every SH band (spz, sog, gltf-splat)
    render_fn: RenderFn | None = None  # cameras -> renderer outputs, for turntables
    content_points: Callable[[], torch.Tensor] | None = None  # points [N, 3] whose bounds frame turntables (None: fixed orbit)
    device: torch.device | str = "cpu"  # where queries run
    file_frame: Any = None  # a user's mesh (lift3d.meshes.io.FileFrame): mesh files go back into its coordinates
    antialiased: bool = False  # Gaussians trained with the 2D (Mip-Splatting) filter: the .spz header's flag

    def provides(self) -> list[str]:
        return [name for name, (need, _) in FORMATS.items() if getattr(self, need) is not None]


def check_formats(formats: Sequence[str], sources: ExportSources) -> list[str]:
    """The formats in order without repeats; unknown or unavailable ones are errors that list the valid."""
    out: list[str] = []
    for fmt in formats:
        fmt = str(fmt).lower().lstrip(".")
        if fmt == "ply":
            raise ExportFormatError("format 'ply' is ambiguous: use mesh-ply (a mesh with vertex colours) or 3dgs-ply (3D Gaussians)")
        if fmt not in FORMATS:
            known = ", ".join(f"{k} ({v[1]})" for k, v in FORMATS.items())
            raise ExportFormatError(f"unknown export format {fmt!r}; known formats: {known}")
        if getattr(sources, FORMATS[fmt][0]) is None:
            raise ExportFormatError(f"this run cannot export {fmt!r} ({FORMATS[fmt][1]}); it can export: {', '.join(sources.provides()) or 'nothing'}")
        if fmt not in out:
            out.append(fmt)
    return out


def export_formats(saver: OutputSaver, formats: Sequence[str], cfg: ExportConfig, sources: ExportSources, stem: str = "model") -> list[Path]:
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
        return cache["mesh"]

    def mesh_for_files() -> Mesh:
        """Textured when a colour field and a texture size are given, else the vertex-coloured mesh."""
        if sources.colour_fn is None or cfg.texture_size <= 0:
            return mesh()
        if "textured" not in cache:
            cache["textured"] = bake_texture(mesh(), sources.colour_fn, cfg.texture_size, cfg.texture_padding,
                                             chunk=cfg.chunk, device=sources.device)
        return cache["textured"]

    frames: list = []

    def kept_gaussians() -> torch.Tensor | None:
        """The Gaussians the files keep (None: all), by the export's opacity floor and count cap; chosen once."""
        if "keep" not in cache and sources.gaussians is not None:
            cache["keep"] = gaussian_keep_mask(sources.gaussians, cfg.gaussian_min_opacity, cfg.gaussian_max_count)
        return cache.get("keep")

    frame = sources.file_frame
    up_axis = "z" if frame is not None else cfg.up_axis  # in the user's file frame, the coordinates are final

    def placed(m: Mesh) -> Mesh:
        """The mesh as written: in the user's file's coordinates when it came from their file."""
        if frame is None:
            return m
        normals = None if m.normals is None else frame.directions_to_file(m.normals)
        return Mesh(frame.to_file(m.vertices), m.faces, m.vertex_colours, normals, m.uvs, m.texture)

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
            options = {"gltf-splat": {"up_axis": up_axis}, "sog": {"sh_palette": cfg.sog_sh_palette},
                       "spz": {"version": cfg.spz_version, "antialiased": sources.antialiased},
                       "sog-lod": {"levels": cfg.lod_levels, "sh_palette": cfg.sog_sh_palette}}.get(fmt, {})
            return [COMPACT_WRITERS[fmt](path, sources.gaussian_params(), keep=kept_gaussians(), sh_degree=degree, **options)]
        if not frames:  # mp4 and gif share one turntable render
            cameras = turntable_cameras(cfg, sources.content_points, cfg.video_frames, cfg.video_elevation_deg, device=sources.device)
            frames.extend(render_frames(sources.render_fn, cameras, cfg.render_batch))
        return [saver.video(path.name, frames, fps=cfg.video_fps)]

    for fmt in formats:  # each format succeeds or warns on its own: one missing writer does not cost the others
        paths = attempt(f"the {fmt} export", write, fmt) or []
        for path in paths:
            log.info("exported %s", path)
        written += paths
    return written


# --------------------------------------------------------------------------------------------- sources


def mesh_from_field(
    density_fn: DensityFn, bbox: BboxLike, cfg: ExportConfig, colour_fn: ColourFn | None = None,
    occupancy: torch.Tensor | None = None, device: torch.device | str | None = None,
) -> Mesh:
    """A NeRF-style field's mesh with the config's options (cfg.bbox overrides ``bbox``); queries run on
    ``device`` (None: the device of ``bbox`` when it is a tensor, else the CPU)."""
    if device is None:
        device = bbox.device if isinstance(bbox, torch.Tensor) else "cpu"
    cfg = for_device(cfg, device)
    return extract_mesh(
        density_fn, cfg.bbox if cfg.bbox is not None else bbox, cfg.resolution, cfg.threshold, cfg.chunk,
        colour_fn=colour_fn, occupancy=occupancy if cfg.bbox is None else None, keep_components=cfg.keep_components,
        target_faces=cfg.target_faces, fill_holes=cfg.fill_holes, device=device,
    )


def turntable_cameras(cfg: ExportConfig, content_points: Callable[[], torch.Tensor] | None, n_frames: int,
                      elevation_deg: float, start_azimuth_deg: float = 0.0, device: torch.device | str = "cpu") -> Any:
    """An orbit of ``n_frames`` cameras as the config frames it: around the content's centre at the distance its bounds
    need (``video_framing=content``, when the sources give content points; ``lift3d.framing``, the viewer's rule), else
    at ``video_distance`` around the origin."""
    cfg = for_device(cfg, device)
    if cfg.video_framing == "content" and content_points is not None:
        return framed_orbit_cameras(content_points(), n_frames, elevation_deg, cfg.video_fovy_deg, cfg.video_width,
                                    cfg.video_height, cfg.video_fill, start_azimuth_deg, device=device)
    return orbit_cameras(n_frames, elevation_deg, cfg.video_distance, cfg.video_fovy_deg, cfg.video_width,
                         cfg.video_height, start_azimuth_deg=start_azimuth_deg, device=device)


def backproject_cameras(cfg: ExportConfig, device: torch.device | str = "cpu",
                        content_points: Callable[[], torch.Tensor] | None = None) -> Any:
    """Views for colour back-projection: two rings around the object (elevations +30 and -15 degrees), framed as the
    turntable is (``turntable_cameras``)."""
    from lift3d.cameras import Cameras

    half = max(1, cfg.backproject_views // 2)
    rings = [turntable_cameras(cfg, content_points, half, elevation, offset, device)
             for elevation, offset in ((30.0, 0.0), (-15.0, 180.0 / half))]
    return Cameras.cat(rings)


def gaussian_colour_fn(field: GaussianField, cfg: ExportConfig, render_fn: RenderFn | None = None,
                       device: torch.device | str = "cpu") -> ColourFn:
    """The Gaussians' colour at points [N, 3] -> [N, 3] as their mesh is coloured: their own colours
    (cfg.gaussian_colours=query, ``field.colour``) or back-projected from renders around the object
    (render; the renders are made on the first call, points no view sees fall back to ``field.colour``)."""
    if cfg.gaussian_colours not in ("query", "render"):
        raise ValueError(f"export.gaussian_colours must be query or render, got {cfg.gaussian_colours!r}")
    if cfg.gaussian_colours == "query":
        return field.colour
    if render_fn is None:
        raise ValueError("export.gaussian_colours=render needs the system's render function")
    cache: dict[str, ColourFn] = {}

    def rendered(points: torch.Tensor) -> torch.Tensor:
        if "fn" not in cache:
            cameras = backproject_cameras(cfg, device, lambda: field.gaussians.means)
            cache["fn"] = RenderedColours(render_fn, cameras, cfg.render_batch, fallback=field.colour)
        return cache["fn"](points)

    return rendered


def gaussian_sources(
    gaussians: GaussianTensors, cfg: ExportConfig, write_3dgs_ply: Callable[[Path], Any] | None = None,
    render_fn: RenderFn | None = None, device: torch.device | str | None = None, field: GaussianField | None = None,
    gaussian_params: Callable[[], dict[str, torch.Tensor]] | None = None, antialiased: bool = False,
) -> ExportSources:
    """Everything a Gaussian system exports: the Gaussians themselves, and a mesh of their density
    coloured by querying them or (cfg.gaussian_colours=render) from renders around the object.
    Queries run on ``device`` (None: where the Gaussians are); ``field``: their density field if the
    caller already built it (with cfg.gaussian_cutoff_sigma); ``gaussian_params``: the model's pre-activation
    parameters (``parameters_dict``), for the formats that keep every SH band (spz, sog, gltf-splat);
    ``antialiased``: trained with the 2D (Mip-Splatting) filter, which the .spz header records."""
    device = gaussians.means.device if device is None else torch.device(device)
    if cfg.gaussian_colours not in ("query", "render"):
        raise ValueError(f"export.gaussian_colours must be query or render, got {cfg.gaussian_colours!r}")
    if cfg.gaussian_colours == "render" and render_fn is None:
        raise ValueError("export.gaussian_colours=render needs the system's render function")
    built: dict[str, Any] = {}  # the density field and its colours, made on first need (the Gaussian files need neither)

    def mesh_box() -> np.ndarray:
        if "box" not in built:
            built["box"] = (as_bbox(cfg.bbox) if cfg.bbox is not None
                            else gaussian_mesh_box(gaussians, cfg.gaussian_cutoff_sigma))
        return built["box"]

    def density_field() -> GaussianField:
        """The density of the Gaussians that reach the mesh's box: the mesh and its colours are only queried there."""
        if "field" not in built:
            if field is None:
                keep = reaching(gaussians, mesh_box(), cfg.gaussian_cutoff_sigma)
                kept = gaussians if bool(keep.all()) else gaussians.select(keep)
                built["field"] = GaussianField(kept, cfg.gaussian_cutoff_sigma).to(device)
            else:
                built["field"] = field.to(device)
        return built["field"]

    def colour_fn(points: torch.Tensor) -> torch.Tensor:
        if "colour" not in built:
            built["colour"] = gaussian_colour_fn(density_field(), cfg, render_fn, device)
        return built["colour"](points)

    def mesh() -> Mesh:
        chosen = for_device(cfg, device)
        return extract_mesh(
            density_field().density, mesh_box(), chosen.resolution, cfg.threshold, cfg.chunk, colour_fn=colour_fn,
            keep_components=cfg.keep_components, target_faces=chosen.target_faces, fill_holes=cfg.fill_holes,
            opacity_scale=GaussianField.opacity_scale, device=device,
        )

    return ExportSources(mesh=mesh, colour_fn=colour_fn, gaussians=gaussians, write_3dgs_ply=write_3dgs_ply,
                         gaussian_params=gaussian_params, render_fn=render_fn, device=device,
                         content_points=lambda: gaussians.means, antialiased=antialiased)


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
