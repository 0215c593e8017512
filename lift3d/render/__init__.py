"""Renderers, one folder each: ``volume/`` (NeRF fields), ``splats/`` (3D Gaussians), ``surfels/`` (2D Gaussian surfels),
``meshes/``; beside them the pieces they share: materials, backgrounds, per-photo appearance and pose refinement."""

from lift3d.render import backgrounds, materials  # noqa: F401  (register the parts)
from lift3d.render.meshes import renderer as mesh_renderer  # noqa: F401
from lift3d.render.splats import renderer as splat_renderer  # noqa: F401
from lift3d.render.surfels import renderer as surfel_renderer  # noqa: F401
from lift3d.render.volume import renderer as volume_renderer  # noqa: F401
