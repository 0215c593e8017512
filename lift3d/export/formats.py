"""The export formats, each one registered entry (``lift3d.registry``, kind ``export-format``), and
``export_formats``, which writes those asked for from what a system can provide (see ``lift3d.export``).

A format is an ``ExportFormat``: its name, the ``ExportSources`` field it writes from, what it is, the ending of its
file's name and ``write(job, path) -> files``, where the ``ExportJob`` holds the sources, the options and what formats
share (the mesh made once, the kept Gaussians, the turntable frames); an external tool it needs is checked by its
``check_tool`` (``lift3d info`` reports it; a missing tool is a warning, not a failed run). The built-in ones below
register with ``@export_format(...)``; a plugin package registers its own the same way, or
``register_entry("export-format", name, ExportFormat(...))``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from lift3d.aftercare import WriterUnavailable, attempt, require_ffmpeg, require_webp
from lift3d.export.config import DEVICE_DEFAULTS, ExportConfig, for_device
from lift3d.export.html import write_html
from lift3d.export.job import ExportJob, ExportSources, gaussian_keep_mask
from lift3d.export.naming import export_name
from lift3d.export.writers import write_glb, write_obj, write_ply
from lift3d.gaussians.formats.gltf import save_gltf_splat
from lift3d.gaussians.formats.ksplat import save_ksplat
from lift3d.gaussians.formats.sog import save_sog
from lift3d.gaussians.formats.sog_lod import save_sog_lod
from lift3d.gaussians.formats.splat import write_splat
from lift3d.gaussians.formats.spz import save_spz
from lift3d.registry import EXPORT_FORMAT, calling_module, closest, entries, register_entry
from lift3d.saving import OutputSaver

__all__ = ["ExportFormat", "ExportFormatError", "ExportJob", "ExportSources", "check_formats", "export_format",
           "export_formats", "export_table", "format_status", "formats_from", "gaussian_keep_mask"]

log = logging.getLogger(__name__)

WriteFn = Callable[[ExportJob, Path], list[Path]]


@dataclass(frozen=True)
class ExportFormat:
    """One export format: what it writes from, what it is, its file's ending, and its writer."""

    name: str  # what --format and system.export.formats name it by
    source: str  # the ExportSources field it writes from (sources without it cannot make the format)
    description: str  # what it is, for `lift3d info` and error texts
    ending: str  # what follows the stem in its file's name (".glb", "-orbit.mp4"): one ending a format
    write: WriteFn  # (job, path of its file) -> every file written
    check_tool: Callable[[], None] | None = None  # raises WriterUnavailable when an external tool it needs is missing


class ExportFormatError(ValueError):
    """A format name lift3d does not know, or one this run cannot make; the message lists the ones it can."""


def export_format(name: str, source: str, description: str, ending: str,
                  check_tool: Callable[[], None] | None = None) -> Callable[[WriteFn], WriteFn]:
    """Decorator on a ``write(job, path)`` function: register it as the export format ``name``."""

    def decorator(write: WriteFn) -> WriteFn:
        record = ExportFormat(name, source, description, ending, write, check_tool)
        register_entry(EXPORT_FORMAT, name, record, owner=calling_module())
        return write

    return decorator


def export_table() -> dict[str, ExportFormat]:
    """name -> format, every registered one (lift3d's and plugins'), in registration order."""
    return entries(EXPORT_FORMAT)


def formats_from(source: str) -> list[str]:
    """The formats written from the ExportSources field ``source`` ("mesh": the mesh formats)."""
    return [name for name, record in export_table().items() if record.source == source]


def format_status() -> dict[str, str]:
    """Every export format: "ok" or what its writer is missing and how to install it (``lift3d info``)."""
    status = {}
    for name, record in export_table().items():
        try:
            if record.check_tool is not None:
                record.check_tool()
            status[name] = "ok"
        except WriterUnavailable as error:
            status[name] = str(error)
    return status


# the ExportConfig options left to DEVICE_DEFAULTS that a format writing from a source reads (for the CPU notice)
DEVICE_OPTIONS = {"mesh": ("resolution", "target_faces"),
                  "render_fn": ("video_frames", "video_fps", "video_width", "video_height")}


@export_format("glb", "mesh", "binary glTF mesh, albedo texture embedded (vertex colors when texture_size=0)", ".glb")
def _glb(job: ExportJob, path: Path) -> list[Path]:
    return write_glb(job.placed(job.textured_mesh()), path, job.up_axis)


@export_format("obj", "mesh", "Wavefront .obj + .mtl + texture .png", ".obj")
def _obj(job: ExportJob, path: Path) -> list[Path]:
    return write_obj(job.placed(job.textured_mesh()), path, job.up_axis)


@export_format("mesh-ply", "mesh", ".ply mesh with vertex colors", "-mesh.ply")
def _mesh_ply(job: ExportJob, path: Path) -> list[Path]:
    return write_ply(job.placed(job.mesh()), path, job.up_axis)


@export_format("3dgs-ply", "write_3dgs_ply", "3D Gaussians in the 3DGS .ply layout", "-gaussians.ply")
def _gaussian_ply(job: ExportJob, path: Path) -> list[Path]:
    job.sources.write_3dgs_ply(path, keep=job.kept_gaussians(), sh_degree=job.sh_degree)
    return [path]


@export_format("splat", "gaussians", "3D Gaussians in the compact .splat layout", ".splat")
def _splat(job: ExportJob, path: Path) -> list[Path]:
    return write_splat(path, job.gaussians())


@export_format("html", "gaussians",
               "one self-contained web page showing the Gaussians (WebGL, orbit controls, works offline)", ".html")
def _html(job: ExportJob, path: Path) -> list[Path]:
    return write_html(path, job.gaussians(), title=job.stem, elevation_deg=job.cfg.video_elevation_deg)


@export_format("spz", "gaussian_params", "3D Gaussians in Niantic's compressed .spz (SH bands kept)", ".spz")
def _spz(job: ExportJob, path: Path) -> list[Path]:
    return [save_spz(path, job.sources.gaussian_params(), keep=job.kept_gaussians(), sh_degree=job.sh_degree,
                     version=job.cfg.spz_version, antialiased=job.sources.antialiased)]


@export_format("sog", "gaussian_params", "3D Gaussians in PlayCanvas's .sog bundle (WebP-quantized, SH palette)", ".sog",
               check_tool=require_webp)
def _sog(job: ExportJob, path: Path) -> list[Path]:
    return [save_sog(path, job.sources.gaussian_params(), keep=job.kept_gaussians(), sh_degree=job.sh_degree,
                     sh_palette=job.cfg.sog_sh_palette)]


@export_format("gltf-splat", "gaussian_params", "3D Gaussians in glTF (-gaussians.glb) with KHR_gaussian_splatting",
               "-gaussians.glb")
def _gltf_splat(job: ExportJob, path: Path) -> list[Path]:
    # glTF is +y up: a run's Gaussians turn from lift3d's world, a converted file's from the .ply frame
    axes = job.up_axis if job.up_axis == "z" else ("world" if job.sources.gaussian_axes == "world" else "y")
    return [save_gltf_splat(path, job.sources.gaussian_params(), keep=job.kept_gaussians(), sh_degree=job.sh_degree,
                            up_axis=axes)]


@export_format("ksplat", "gaussian_params", "3D Gaussians in GaussianSplats3D's .ksplat (16-bit, SH bands up to 2)",
               ".ksplat")
def _ksplat(job: ExportJob, path: Path) -> list[Path]:
    return [save_ksplat(path, job.sources.gaussian_params(), keep=job.kept_gaussians(), sh_degree=job.sh_degree)]


@export_format("sog-lod", "gaussian_params",
               "levels of detail as PlayCanvas's streamed SOG (-lod/lod-meta.json, a SOG per level)", "-lod/lod-meta.json",
               check_tool=require_webp)
def _sog_lod(job: ExportJob, path: Path) -> list[Path]:
    return [save_sog_lod(path, job.sources.gaussian_params(), keep=job.kept_gaussians(), sh_degree=job.sh_degree,
                         levels=job.cfg.lod_levels, sh_palette=job.cfg.sog_sh_palette)]


@export_format("mp4", "render_fn", "turntable video (H.264)", "-orbit.mp4", check_tool=require_ffmpeg)
def _mp4(job: ExportJob, path: Path) -> list[Path]:
    return [job.saver.video(path.name, job.turntable_frames(), fps=job.cfg.video_fps)]


@export_format("gif", "render_fn", "turntable animation", "-orbit.gif")
def _gif(job: ExportJob, path: Path) -> list[Path]:
    return [job.saver.video(path.name, job.turntable_frames(), fps=job.cfg.video_fps)]


def check_formats(formats: Sequence[str], sources: ExportSources) -> list[str]:
    """The formats in order without repeats; unknown or unavailable ones are errors that list the valid."""
    table = export_table()
    out: list[str] = []
    for fmt in formats:
        fmt = str(fmt).lower().lstrip(".")
        if fmt == "ply" and "ply" not in table:
            raise ExportFormatError("format 'ply' is ambiguous: use mesh-ply (a mesh with vertex colors) or 3dgs-ply "
                                    "(3D Gaussians)")
        if fmt not in table:
            near = closest(fmt, list(table))
            hint = f" (did you mean {near}?)" if near else ""
            known = ", ".join(f"{name} ({record.description})" for name, record in table.items())
            raise ExportFormatError(f"unknown export format {fmt!r}{hint}; known formats: {known}")
        record = table[fmt]
        if getattr(sources, record.source) is None:
            can = ", ".join(sources.provides()) or "nothing"
            raise ExportFormatError(f"this run cannot export {fmt!r} ({record.description}); it can export: {can}")
        if fmt not in out:
            out.append(fmt)
    return out


def export_formats(saver: OutputSaver, formats: Sequence[str], cfg: ExportConfig, sources: ExportSources,
                   stem: str = "model") -> list[Path]:
    """Write each of ``formats`` under ``saver`` as ``<stem><its ending>`` (cfg.stem wins when set); returns every
    file written. The mesh is built once and textured once, whatever the number of mesh formats."""
    formats = check_formats(formats, sources)
    table = export_table()
    chosen = for_device(cfg, sources.device)
    used = {option for fmt in formats for option in DEVICE_OPTIONS.get(table[fmt].source, ())}
    automatic = [f"{name}={getattr(chosen, name)}" for name in DEVICE_DEFAULTS if getattr(cfg, name) is None and name in used]
    if automatic and torch.device(sources.device).type == "cpu":
        log.info("exporting on the CPU with %s (set system.export.NAME=VALUE to change)", ", ".join(automatic))
    job = ExportJob(sources, chosen, saver, chosen.stem or stem)

    def write(fmt: str) -> list[Path]:
        return table[fmt].write(job, saver.path(export_name(job.stem, fmt)))

    written: list[Path] = []
    for fmt in formats:  # each format succeeds or warns on its own: one missing writer does not cost the others
        paths = attempt(f"the {fmt} export", write, fmt) or []
        for path in paths:
            log.info("exported %s", path)
        written += paths
    return written
