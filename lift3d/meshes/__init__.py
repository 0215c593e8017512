"""Meshes as a representation: the ``Mesh`` type, tet grids, marching tets, DMTet, regularisers, I/O."""

from lift3d.meshes import dmtet  # noqa: F401  (registers "dmtet")
from lift3d.meshes.mesh import Mesh, face_normals, vertex_normals

__all__ = ["Mesh", "face_normals", "vertex_normals"]
