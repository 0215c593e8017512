"""Renderers: the Gaussian splat rasterizer (torch and gsplat backends)."""

from lift3d.render import splat  # noqa: F401  (register the parts)
