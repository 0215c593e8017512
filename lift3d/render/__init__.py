"""render."""

from lift3d.render import mesh_renderer  # noqa: F401  (registers "mesh-rasterizer")
