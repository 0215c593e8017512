"""Exporters: meshes from NeRF fields and Gaussians, textured .glb / .obj, vertex-color .ply, Gaussian files,
turntable video.

A system says what it can provide in ``export_sources() -> ExportSources``; ``BaseSystem.export`` hands that to
``export_formats`` (``lift3d export CONFIG --resume CKPT [--format glb obj ...]``). No exporter reaches into a
system. Options live in ``ExportConfig``, which a system's config embeds as ``export`` (so
``system.export.resolution=512`` works on the command line). The Gaussian file codecs live in
``lift3d.gaussians.formats``; this package only calls them.

Modules: ``config`` (ExportConfig, device defaults), ``formats`` (every export format, each registered in
``lift3d.registry`` as kind ``export-format``; ``export_formats``), ``job`` (ExportSources, and the ExportJob a format's
writer gets), ``sources`` (mesh_from_field, gaussian_sources), ``views`` (turntable and back-projection cameras),
``tsdf`` (fusion of rendered depths into a voxel grid, its mesh) and ``tsdf_sources`` (the views, renders and clean-up of
``export.mesh_method=tsdf``).

A NeRF system::

    def export_sources(self):
        cfg = self.cfg.export
        return ExportSources(
            mesh=lambda: mesh_from_field(self.field.density, self.field.bbox, cfg, color_fn=self.field.albedo,
                                         occupancy=self.occupancy_grid.mask, device=self.device),
            color_fn=self.field.albedo,  # points [N, 3] -> albedo [N, 3], baked into the texture
            render_fn=lambda cameras: self.render_views({"cameras": cameras}),
            device=self.device,
        )

A Gaussian system (activated tensors; colors from SH degree 0)::

        g = GaussianTensors(means, scales, quats_wxyz, opacities, colors=rgb_from_sh_dc(sh_dc))
        return gaussian_sources(g, cfg, write_3dgs_ply=lambda path, **kept: save_ply(path, model, **kept),
                                gaussian_params=model.parameters_dict,
                                render_fn=lambda cameras: self.render_views({"cameras": cameras}), device=self.device)

A mesh system passes ``mesh=lambda: Mesh(vertices, faces, vertex_colors=...)`` and a ``color_fn``.

Formats (``export_table()``; a plugin package adds its own): ``glb``, ``obj`` (+ .mtl + .png), ``mesh-ply``
(need ``mesh``); ``3dgs-ply`` (needs ``write_3dgs_ply``); ``splat``, ``html`` (need ``gaussians``); ``spz``, ``sog``,
``gltf-splat``, ``ksplat``, ``sog-lod`` (need ``gaussian_params``; codecs in ``lift3d.gaussians.formats``); ``mp4``,
``gif`` (need ``render_fn``; framed by ``content_points``, as the viewer frames them: ``lift3d.framing``). Files are
``<stem>.glb``, ``<stem>.obj``/``.mtl``/``.png``, ``<stem>-mesh.ply``, ``<stem>-gaussians.ply``, ``<stem>.splat``,
``<stem>.spz``, ``<stem>.sog``, ``<stem>-gaussians.glb``, ``<stem>-orbit.mp4``/``.gif``, ``<stem>.html``
(``lift3d.export.naming``: a converted file's stem carries its format, so no export replaces another). A format the
sources cannot make is an error naming what they can make; ``ply`` alone is refused as ambiguous. Options left at
None (grid resolution, face target, turntable frames, rate and size) take ``DEVICE_DEFAULTS`` for the device.

The parts are plain functions on tensors and arrays: ``extract_mesh`` (grid sampling in blocks,
marching cubes, automatic threshold, clean-up, decimation, colors), ``GaussianField`` (density and
color of Gaussians), ``RenderedColors`` (colors back-projected from renders), ``bake_texture``
(xatlas atlas + baking), ``write_glb`` / ``write_obj`` / ``write_ply``, ``write_orbit_video``; ``write_splat`` /
``read_splat`` are re-exported from ``lift3d.gaussians.formats.splat``.
"""

from lift3d.export.backproject import RenderedColors
from lift3d.export.config import ExportConfig
from lift3d.export.formats import ExportFormat, ExportSources, export_format, export_formats, export_table
from lift3d.export.gaussian_density import GaussianField, GaussianTensors, gaussian_bbox
from lift3d.export.mesh import extract_mesh
from lift3d.export.sources import gaussian_color_fn, gaussian_sources, mesh_from_field
from lift3d.export.texture import bake_texture
from lift3d.export.video import orbit_cameras, write_orbit_video
from lift3d.export.writers import write_glb, write_obj, write_ply
from lift3d.gaussians.formats.splat import read_splat, rgb_from_sh_dc, write_splat
from lift3d.meshes.mesh import Mesh

__all__ = [
    "ExportConfig",
    "ExportFormat",
    "ExportSources",
    "GaussianField",
    "GaussianTensors",
    "Mesh",
    "RenderedColors",
    "bake_texture",
    "export_format",
    "export_formats",
    "export_table",
    "extract_mesh",
    "gaussian_bbox",
    "gaussian_color_fn",
    "gaussian_sources",
    "mesh_from_field",
    "orbit_cameras",
    "read_splat",
    "rgb_from_sh_dc",
    "write_glb",
    "write_obj",
    "write_orbit_video",
    "write_ply",
    "write_splat",
]
