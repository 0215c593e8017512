"""Meshes as a representation: the ``Mesh`` type, tet grids, marching tets, DMTet, regularizers, I/O."""

from lift3d.meshes import custom_mesh, dmtet, texture_field  # noqa: F401  (register "custom-mesh", "dmtet", "hash-grid-texture")
from lift3d.meshes.mesh import Mesh, face_normals, vertex_normals

__all__ = ["Mesh", "face_normals", "vertex_normals"]
