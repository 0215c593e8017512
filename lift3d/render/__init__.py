"""Renderers: volume rendering, Gaussian splatting, mesh rasterization; materials and backgrounds."""

from lift3d.render import backgrounds, materials, mesh_renderer, splat, volume  # noqa: F401  (register the parts)
