"""What an export format writes from: the ``ExportSources`` a system hands over, and the ``ExportJob`` of one
``export_formats`` call, which makes what several formats share once (the mesh, its textured copy, the Gaussians the
files keep, the turntable frames)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from lift3d.export.backproject import RenderFn
from lift3d.export.config import ExportConfig
from lift3d.export.gaussian_density import GaussianTensors
from lift3d.export.grid import ColorFn
from lift3d.export.mesh import decimated_to
from lift3d.export.texture import bake_texture
from lift3d.export.video import render_frames
from lift3d.export.views import framing_points, turntable_cameras
from lift3d.meshes.mesh import Mesh
from lift3d.registry import EXPORT_FORMAT, entries
from lift3d.saving import OutputSaver

log = logging.getLogger(__name__)


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
        """The registered export formats these sources can make."""
        return [name for name, record in entries(EXPORT_FORMAT).items() if getattr(self, record.source) is not None]


@dataclass
class ExportJob:
    """One ``export_formats`` call as a format's ``write(job, path)`` sees it: the sources, the options (device
    defaults chosen), the saver and the stem, and what several formats share, each made at most once."""

    sources: ExportSources
    cfg: ExportConfig
    saver: OutputSaver
    stem: str
    made: dict[str, Any] = field(default_factory=dict)  # the mesh, its textured copy, the kept Gaussians, the frames

    @property
    def up_axis(self) -> str:
        """The files' up axis: "z" for a user's mesh (in its own file's coordinates the numbers are final)."""
        return "z" if self.sources.file_frame is not None else self.cfg.up_axis

    @property
    def sh_degree(self) -> int | None:
        """The SH degree Gaussian files keep (None: every band)."""
        return self.cfg.gaussian_sh_degree if self.cfg.gaussian_sh_degree >= 0 else None

    def mesh(self) -> Mesh:
        """The sources' vertex-colored mesh, decimated to export.target_faces when it comes whole."""
        if "mesh" not in self.made:
            mesh = self.sources.mesh().numpy()  # the exporters work on numpy arrays
            if self.sources.mesh_to_budget:
                mesh = decimated_to(mesh, self.cfg.target_faces, self.sources.color_fn, self.cfg.chunk, self.sources.device)
            self.made["mesh"] = mesh
        return self.made["mesh"]

    def textured_mesh(self) -> Mesh:
        """Textured when a color field and a texture size are given, else the vertex-colored mesh."""
        if self.sources.color_fn is None or self.cfg.texture_size <= 0:
            return self.mesh()
        if "textured" not in self.made:
            self.made["textured"] = bake_texture(self.mesh(), self.sources.color_fn, self.cfg.texture_size,
                                                 self.cfg.texture_padding, chunk=self.cfg.chunk, device=self.sources.device)
        return self.made["textured"]

    def placed(self, mesh: Mesh) -> Mesh:
        """The mesh as written: in the user's file's coordinates when it came from their file."""
        frame = self.sources.file_frame
        if frame is None:
            return mesh
        normals = None if mesh.normals is None else frame.directions_to_file(mesh.normals)
        return replace(mesh, vertices=frame.to_file(mesh.vertices), normals=normals)

    def kept_gaussians(self) -> torch.Tensor | None:
        """The Gaussians the files keep (None: all), by the export's opacity floor and count cap; chosen once."""
        if "keep" not in self.made and self.sources.gaussians is not None:
            self.made["keep"] = gaussian_keep_mask(self.sources.gaussians, self.cfg.min_opacity, self.cfg.max_gaussians)
        return self.made.get("keep")

    def gaussians(self) -> GaussianTensors:
        """The activated Gaussians the files keep."""
        keep = self.kept_gaussians()
        return self.sources.gaussians if keep is None else self.sources.gaussians.select(keep)

    def turntable_frames(self) -> list:
        """The turntable's frames, rendered once for every video format."""
        if "frames" not in self.made:
            sources = self.sources
            framing = framing_points(sources.content_points, self.mesh if sources.mesh is not None else None)
            cameras = turntable_cameras(self.cfg, framing, self.cfg.video_frames, self.cfg.video_elevation_deg,
                                        device=sources.device)
            self.made["frames"] = render_frames(sources.render_fn, cameras, self.cfg.render_batch)
        return self.made["frames"]


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
