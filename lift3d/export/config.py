"""``ExportConfig``: how assets are exported (a system's ``export`` config), with device-dependent defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from lift3d.config import bounded, choice
from lift3d.export.tsdf import TSDFConfig

# field -> (on a GPU, on the CPU): what an ExportConfig field left at None takes where the export runs. The CPU values
# are smaller because the density grid costs resolution^3, the UV atlas grows with the faces, and a turntable frame
# costs a full CPU rasterization.
DEVICE_DEFAULTS: dict[str, tuple[int, int]] = {
    "resolution": (256, 128), "target_faces": (100000, 50000), "video_frames": (120, 60), "video_fps": (30, 20),
    "video_width": (512, 384), "video_height": (512, 384),
}

MAX_VIDEO_SIDE = 8192  # the widest frame lift3d renders into a video (8K; H.264 players stop around there)


def for_device(cfg: ExportConfig, device: torch.device | str) -> ExportConfig:
    """``cfg`` with its automatic (None) fields of DEVICE_DEFAULTS set for an export on ``device``."""
    on_cpu = torch.device(device).type == "cpu"
    chosen = {name: values[on_cpu] for name, values in DEVICE_DEFAULTS.items() if getattr(cfg, name) is None}
    return replace(cfg, **chosen) if chosen else cfg


def export_format_names() -> tuple[str, ...]:
    """Every registered export format's name (lift3d's and plugins'), read when a config is checked."""
    from lift3d.registry import EXPORT_FORMAT, entries

    return tuple(entries(EXPORT_FORMAT))


@dataclass
class ExportConfig:
    """How assets are exported; systems embed it as ``export`` in their config."""

    # keys renamed to one spelling per idea: the old name still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"gaussian_max_count": "max_gaussians", "gaussian_min_opacity": "min_opacity",
                                         "gaussian_colours": "gaussian_colors"}

    # formats written when `lift3d export` gets no --format
    formats: list = choice(["glb"], among=export_format_names, fold_case=True)
    stem: str = ""  # file-name stem of the exports ("": it<step>)
    # mesh: marching-cubes samples along the longest side of the box (None: DEVICE_DEFAULTS)
    resolution: int | None = bounded(None, low=2, example=256)
    threshold: float | None = None  # mesh: density iso-level (None: automatic, Otsu on voxel opacity, logged)
    bbox: list | None = None  # mesh: [[x0, y0, z0], [x1, y1, z1]] to mesh (None: the representation's own box)
    fill_holes: bool = True  # mesh: fill enclosed empty pockets, so shells mesh as one outer surface
    keep_components: int = bounded(1, low=0)  # mesh: keep the k largest connected parts (0: all)
    # mesh: auto (the representation's own: TSDF for surfels, density for Gaussians and NeRFs), density, or tsdf (rendered
    # depths fused: Gaussian and surfel runs)
    mesh_method: str = choice("auto", "density", "tsdf")
    tsdf: TSDFConfig = field(default_factory=TSDFConfig)  # mesh_method tsdf: how rendered depths are fused
    # mesh: decimate to about this many faces (0: off; None: DEVICE_DEFAULTS)
    target_faces: int | None = bounded(None, low=0, example=100000)
    # mesh: side of the baked albedo texture (0: vertex colors in .glb/.obj)
    texture_size: int = bounded(1024, low=8, allowed=(0,))
    texture_padding: int = bounded(2, low=0)  # mesh: texels between UV charts
    up_axis: str = choice("y", "z")  # mesh files: y (glTF/Blender convention; converted from lift3d's +z up) or z (as is)
    chunk: int = bounded(262144, low=8)  # points per density or color query
    gaussian_cutoff_sigma: float = bounded(3.0, above=0)  # Gaussians: each reaches this many standard deviations when meshed
    # Gaussians' mesh colors: query (their own colors) or render (back-projected)
    gaussian_colors: str = choice("query", "render")
    backproject_views: int = bounded(16, low=1)  # render colors: views around the object (half at +30 deg, half at -15 deg)
    video_frames: int | None = bounded(None, low=1, example=120)  # turntable: frames in a full turn (None: DEVICE_DEFAULTS)
    video_fps: int | None = bounded(None, low=1, example=30)  # turntable: frames per second (None: DEVICE_DEFAULTS)
    video_elevation_deg: float = bounded(15.0, low=-90, high=90)  # turntable: camera elevation above the xy-plane
    # turntable: content (orbit the content's center, its bounds in view) or fixed
    video_framing: str = choice("content", "fixed")
    # turntable, framing=content: share of the frame's half-height the content's bounds span
    video_fill: float = bounded(0.9, above=0, high=1)
    # turntable: camera distance from the origin (framing=fixed, or a run without content points)
    video_distance: float = bounded(3.0, above=0)
    video_fovy_deg: float = bounded(40.0, above=0, below=180)  # turntable: vertical field of view
    # turntable: frame width in pixels (None: DEVICE_DEFAULTS)
    video_width: int | None = bounded(None, low=2, high=MAX_VIDEO_SIDE, example=1920)
    # turntable: frame height in pixels (None: DEVICE_DEFAULTS)
    video_height: int | None = bounded(None, low=2, high=MAX_VIDEO_SIDE, example=1080)
    render_batch: int = bounded(4, low=1)  # views per render call (turntable and back-projection)
    # Gaussian files (3dgs-ply, splat, spz, sog, gltf-splat): drop Gaussians fainter than this (0: keep all)
    min_opacity: float = bounded(0.0, low=0, high=1)
    max_gaussians: int = bounded(0, low=0)  # Gaussian files: keep at most this many, the most visible (volume x opacity; 0: all)
    # 3dgs-ply, spz, sog, gltf-splat: SH bands up to this degree (-1: all; 0 makes the file about 4x smaller)
    gaussian_sh_degree: int = bounded(-1, low=0, high=3, allowed=(-1,), example=0)
    # sog: entries of the SH palette (k-means of the higher bands; 0: a power of two near N / 16)
    sog_sh_palette: int = bounded(0, low=0)
    spz_version: int = choice(4, 3)  # spz: 4 (ZSTD streams, Niantic's current) or 3 (one gzip stream, for readers that predate 4)
    # sog-lod: levels of detail (each coarser one merges neighboring Gaussians in pairs: about half)
    lod_levels: int = bounded(3, low=1)
