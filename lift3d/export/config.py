"""``ExportConfig``: how assets are exported (a system's ``export`` config), with device-dependent defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

import torch

from lift3d.export.tsdf import TSDFConfig

# field -> (on a GPU, on the CPU): what an ExportConfig field left at None takes where the export runs. The CPU values
# are smaller because the density grid costs resolution^3, the UV atlas grows with the faces, and a turntable frame
# costs a full CPU rasterization.
DEVICE_DEFAULTS: dict[str, tuple[int, int]] = {
    "resolution": (256, 128), "target_faces": (100000, 50000), "video_frames": (120, 60), "video_fps": (30, 20),
    "video_width": (512, 384), "video_height": (512, 384),
}

def for_device(cfg: ExportConfig, device: torch.device | str) -> ExportConfig:
    """``cfg`` with its automatic (None) fields of DEVICE_DEFAULTS set for an export on ``device``."""
    on_cpu = torch.device(device).type == "cpu"
    chosen = {name: values[on_cpu] for name, values in DEVICE_DEFAULTS.items() if getattr(cfg, name) is None}
    return replace(cfg, **chosen) if chosen else cfg


@dataclass
class ExportConfig:
    """How assets are exported; systems embed it as ``export`` in their config."""

    # keys renamed to one spelling per idea: the old name still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"gaussian_max_count": "max_gaussians", "gaussian_min_opacity": "min_opacity",
                                         "gaussian_colours": "gaussian_colors"}

    formats: list = field(default_factory=lambda: ["glb"])  # formats written when `lift3d export` gets no --format
    stem: str = ""  # file-name stem of the exports ("": it<step>)
    resolution: int | None = None  # mesh: marching-cubes samples along the longest side of the box (None: DEVICE_DEFAULTS)
    threshold: float | None = None  # mesh: density iso-level (None: automatic, Otsu on voxel opacity, logged)
    bbox: list | None = None  # mesh: [[x0, y0, z0], [x1, y1, z1]] to mesh (None: the representation's own box)
    fill_holes: bool = True  # mesh: fill enclosed empty pockets, so shells mesh as one outer surface
    keep_components: int = 1  # mesh: keep the k largest connected parts (0: all)
    # mesh: auto (the representation's own: TSDF for surfels, density for Gaussians and NeRFs), density, or tsdf (rendered
    # depths fused: Gaussian and surfel runs)
    mesh_method: str = "auto"
    tsdf: TSDFConfig = field(default_factory=TSDFConfig)  # mesh_method tsdf: how rendered depths are fused
    target_faces: int | None = None  # mesh: decimate to about this many faces (0: off; None: DEVICE_DEFAULTS)
    texture_size: int = 1024  # mesh: side of the baked albedo texture (0: vertex colors in .glb/.obj)
    texture_padding: int = 2  # mesh: texels between UV charts
    up_axis: str = "y"  # mesh files: y (glTF/Blender convention; converted from lift3d's +z up) or z (as is)
    chunk: int = 262144  # points per density or color query
    gaussian_cutoff_sigma: float = 3.0  # Gaussians: each reaches this many standard deviations when meshed
    gaussian_colors: str = "query"  # Gaussians' mesh colors: query (their own colors) or render (back-projected)
    backproject_views: int = 16  # render colors: views around the object (half at +30 deg, half at -15 deg)
    video_frames: int | None = None  # turntable: frames in a full turn (None: DEVICE_DEFAULTS)
    video_fps: int | None = None  # turntable: frames per second (None: DEVICE_DEFAULTS)
    video_elevation_deg: float = 15.0  # turntable: camera elevation above the xy-plane
    video_framing: str = "content"  # turntable: content (orbit the content's center, its bounds in view) or fixed
    video_fill: float = 0.9  # turntable, framing=content: share of the frame's half-height the content's bounds span
    video_distance: float = 3.0  # turntable: camera distance from the origin (framing=fixed, or a run without content points)
    video_fovy_deg: float = 40.0  # turntable: vertical field of view
    video_width: int | None = None  # turntable: frame width in pixels (None: DEVICE_DEFAULTS)
    video_height: int | None = None  # turntable: frame height in pixels (None: DEVICE_DEFAULTS)
    render_batch: int = 4  # views per render call (turntable and back-projection)
    # Gaussian files (3dgs-ply, splat, spz, sog, gltf-splat): drop Gaussians fainter than this (0: keep all)
    min_opacity: float = 0.0
    max_gaussians: int = 0  # Gaussian files: keep at most this many, the most visible (volume x opacity; 0: all)
    # 3dgs-ply, spz, sog, gltf-splat: SH bands up to this degree (-1: all; 0 makes the file about 4x smaller)
    gaussian_sh_degree: int = -1
    sog_sh_palette: int = 0  # sog: entries of the SH palette (k-means of the higher bands; 0: a power of two near N / 16)
    spz_version: int = 4  # spz: 4 (ZSTD streams, Niantic's current) or 3 (one gzip stream, for readers that predate 4)
    lod_levels: int = 3  # sog-lod: levels of detail (each coarser one merges neighboring Gaussians in pairs: about half)

    def __post_init__(self) -> None:
        """Sizes and counts that no export can use are refused when the system is built, not after training."""
        from lift3d.config.checks import check_minimums
        from lift3d.export.video import check_video_size

        check_minimums("system.export", self, {
            "resolution": (2, 256), "chunk": (8, 262144), "video_frames": (1, 120), "video_fps": (1, 30),
            "render_batch": (1, 4), "backproject_views": (1, 16), "texture_size": (0, 1024), "texture_padding": (0, 2),
            "target_faces": (0, 100000), "keep_components": (0, 1), "max_gaussians": (0, 0),
            "gaussian_sh_degree": (0, -1, (-1,)), "sog_sh_palette": (0, 0), "min_opacity": (0.0, 0.0),
        })
        width, height = (DEVICE_DEFAULTS[k][0] if v is None else v for k, v in (("video_width", self.video_width),
                                                                               ("video_height", self.video_height)))
        check_video_size(width, height, "system.export.video_width", "system.export.video_height")
        from lift3d.config import ConfigError

        if self.mesh_method not in ("auto", "density", "tsdf"):
            raise ConfigError(f"system.export.mesh_method must be auto, density or tsdf, got {self.mesh_method!r}")
        if self.video_framing not in ("content", "fixed"):
            raise ConfigError(f"system.export.video_framing must be content or fixed, got {self.video_framing!r}")
        if not 0.0 < self.video_fill <= 1.0:
            raise ConfigError(f"system.export.video_fill must be in (0, 1] (a share of the frame), got {self.video_fill}")
        if self.spz_version not in (3, 4):
            raise ConfigError(f"system.export.spz_version must be 4 or 3 (for readers that predate 4), got {self.spz_version!r}")
        if self.lod_levels < 1:
            raise ConfigError(f"system.export.lod_levels must be at least 1 (level 0 is the Gaussians), got {self.lod_levels}")
