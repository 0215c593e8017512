"""The one ``Mesh`` (``lift3d.meshes.mesh``): tensors <-> numpy arrays (textures float <-> uint8), the same normals on
both sides, its checks, and a mesh with its own UV index buffer through the export clean-up."""

import numpy as np
import pytest
import torch
import trimesh

from lift3d.export.mesh import remove_degenerate, submesh
from lift3d.meshes.mesh import Mesh


def box() -> trimesh.Trimesh:
    return trimesh.creation.box(extents=(1.0, 2.0, 0.5))


def test_tensors_and_numpy_arrays_convert_both_ways():
    b = box()
    texture = torch.rand(4, 5, 3)
    mesh = Mesh(torch.tensor(b.vertices, dtype=torch.float32, requires_grad=True), torch.tensor(b.faces),
                vertex_colors=torch.rand(len(b.vertices), 3), uv=torch.rand(len(b.vertices), 2), texture=texture)
    assert mesh.is_tensor and mesh.num_vertices == 8 and mesh.num_faces == 12
    arrays = mesh.numpy()
    assert not arrays.is_tensor and arrays.numpy() is arrays
    assert arrays.vertices.dtype == np.float32 and arrays.faces.dtype == np.int64 and arrays.texture.dtype == np.uint8
    assert np.array_equal(arrays.texture, np.round(texture.numpy() * 255).astype(np.uint8))
    back = arrays.to("cpu")
    assert back.is_tensor and back.faces.dtype == torch.int64 and back.texture.dtype == torch.float32
    assert torch.allclose(back.texture, texture, atol=0.5 / 255)
    assert torch.equal(back.vertices, mesh.vertices.detach()) and torch.equal(back.uv, mesh.uv)
    doubled = mesh.to(torch.float64)
    assert doubled.vertices.dtype == torch.float64 and doubled.faces.dtype == torch.int64  # indices stay integers
    # a tensor mesh given numpy arrays for its other fields converts them (a uint8 texture to 0..1)
    mixed = Mesh(torch.tensor(b.vertices, dtype=torch.float32), b.faces, uv=np.zeros((8, 2), np.float32),
                 texture=np.full((2, 2, 3), 255, np.uint8))
    assert isinstance(mixed.faces, torch.Tensor) and torch.equal(mixed.texture, torch.ones(2, 2, 3))


def test_normals_are_the_same_for_tensors_and_arrays():
    b = trimesh.creation.icosphere(subdivisions=2)
    arrays = Mesh(b.vertices, b.faces)
    tensors = arrays.to("cpu")
    assert np.allclose(arrays.vertex_normals(), tensors.vertex_normals().numpy(), atol=1e-6)
    assert np.allclose(arrays.face_normals(), tensors.face_normals().numpy(), atol=1e-6)
    assert np.allclose(arrays.vertex_normals(), b.vertices / np.linalg.norm(b.vertices, axis=1, keepdims=True), atol=0.05)
    assert np.allclose(arrays.with_normals().normals, arrays.vertex_normals())
    face_n = arrays.face_normals()  # outward: along the face centers
    assert (np.einsum("fc,fc->f", face_n, b.vertices[b.faces].mean(1)) > 0).all()


@pytest.mark.parametrize(("make", "message"), [
    (lambda b: Mesh(b.vertices[:, :2], b.faces), "vertices must be"),
    (lambda b: Mesh(b.vertices, b.faces + 1), "outside"),
    (lambda b: Mesh(b.vertices, b.faces, vertex_colors=np.zeros((3, 3))), "vertex_colors must be"),
    (lambda b: Mesh(b.vertices, b.faces, texture=np.zeros((2, 2, 3), np.uint8)), "needs uv"),
    (lambda b: Mesh(b.vertices, b.faces, uv=np.zeros((4, 2)), uv_faces=b.faces[:3]), "uv_faces must match"),
    (lambda b: Mesh(torch.zeros(3, 3), torch.zeros(1, 3)), "integer tensor"),
])
def test_bad_meshes_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make(box())


def test_a_separate_uv_index_buffer_survives_the_clean_up():
    """An OBJ-style mesh (UVs with their own faces): welding and dropping faces keep each corner's UV."""
    b = box()
    uv = np.random.default_rng(0).uniform(size=(36, 2)).astype(np.float32)
    uv_faces = np.arange(36).reshape(12, 3)
    vertices = np.concatenate([b.vertices, b.vertices[:1]])  # a ninth vertex at the first one's place
    faces = b.faces.copy()
    faces[faces == 0] = np.where(np.arange((faces == 0).sum()) % 2 == 0, 0, 8)
    mesh = Mesh(vertices, faces, uv=uv, uv_faces=uv_faces)
    welded = remove_degenerate(mesh, 1e-6)
    assert welded.num_vertices == 8 and np.array_equal(welded.uv_faces, uv_faces) and np.array_equal(welded.uv, uv)
    corners = welded.vertices[welded.faces]
    assert np.allclose(corners, b.vertices[b.faces])
    half = submesh(welded, np.arange(12) < 6)
    assert np.array_equal(half.uv[half.uv_faces], uv[uv_faces[:6]])
    assert np.allclose(half.vertices[half.faces], b.vertices[b.faces[:6]])
