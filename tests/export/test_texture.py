"""UV unwrapping, texel rasterization, seam filling and albedo baking."""

import numpy as np
import pytest
import torch

from lift3d.export.mesh import extract_mesh
from lift3d.export.texture import bake_texture, fill_empty_texels, rasterize_uv, unwrap_uv
from lift3d.meshes.mesh import Mesh
from tests.plugins.analytic_sphere import position_color, sphere_density

BOX = [[-1, -1, -1], [1, 1, 1]]


def _inside_by_edge_signs(tri: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Point-in-triangle [P] by the signs of the three edge functions (independent of barycentrics)."""
    def edge(a, b):
        return (b[0] - a[0]) * (p[:, 1] - a[1]) - (b[1] - a[1]) * (p[:, 0] - a[0])

    e = np.stack([edge(tri[0], tri[1]), edge(tri[1], tri[2]), edge(tri[2], tri[0])], 1)
    return (e >= 0).all(1) | (e <= 0).all(1)


def test_rasterize_uv_matches_a_per_texel_brute_force():
    rng = np.random.default_rng(0)
    size = 24
    uvs = rng.uniform(0.02, 0.98, size=(12, 2))
    faces = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]])
    face_id, bary = rasterize_uv(uvs, faces, size, chunk=50)  # small chunks: many groups
    ys, xs = np.mgrid[0:size, 0:size]
    centers = np.stack([(xs.ravel() + 0.5) / size, 1 - (ys.ravel() + 0.5) / size], 1)  # in uv
    covered_by = [_inside_by_edge_signs(uvs[f], centers).reshape(size, size) for f in faces]
    any_cover = np.any(covered_by, axis=0)
    assert np.array_equal(face_id >= 0, any_cover)
    for y, x in zip(*np.nonzero(any_cover)):
        f = face_id[y, x]
        assert covered_by[f][y, x]
        # the weights rebuild the texel center from the triangle's corners
        assert np.allclose(bary[y, x] @ uvs[faces[f]], [(x + 0.5) / size, 1 - (y + 0.5) / size], atol=1e-5)


def test_two_triangles_covering_the_square_cover_every_texel():
    uvs = np.array([[0, 0], [1, 0], [1, 1], [0, 1]], float)
    face_id, bary = rasterize_uv(uvs, np.array([[0, 1, 2], [0, 2, 3]]), 16)
    assert (face_id >= 0).all()
    assert np.allclose(bary.sum(-1), 1, atol=1e-6) and (bary >= -1e-6).all()


def test_fill_empty_texels_copies_the_nearest_filled_one():
    rng = np.random.default_rng(1)
    image = rng.uniform(size=(9, 11, 3)).astype(np.float32)
    filled = rng.uniform(size=(9, 11)) < 0.2
    out = fill_empty_texels(image, filled)
    fy, fx = np.nonzero(filled)
    for y in range(9):
        for x in range(11):
            d = (fy - y) ** 2 + (fx - x) ** 2
            nearest = d == d.min()
            assert any(np.allclose(out[y, x], image[a, b]) for a, b in zip(fy[nearest], fx[nearest]))
    limited = fill_empty_texels(image, filled, max_distance=1)
    far = np.array([[min((fy - y) ** 2 + (fx - x) ** 2) > 1 for x in range(11)] for y in range(9)])
    assert np.array_equal(limited[far], image[far])


@pytest.fixture(scope="module")
def sphere_mesh() -> Mesh:
    return extract_mesh(lambda p: sphere_density(p, 0.6), BOX, 40, threshold=25.0)


@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_unwrap_keeps_the_geometry_and_places_every_face(sphere_mesh, scale):
    # xatlas drops faces under an absolute area; at 1/100 scale all faces would be dropped unnormalized
    sphere_mesh = Mesh(sphere_mesh.vertices * scale, sphere_mesh.faces)
    unwrapped = unwrap_uv(sphere_mesh, texture_size=256)
    assert len(unwrapped.faces) == len(sphere_mesh.faces)
    assert unwrapped.uv.min() >= 0 and unwrapped.uv.max() <= 1
    # each output face has the same corners as some input face (vertices are only split along seams)
    key = {tuple(np.round(sphere_mesh.vertices[f], 6).ravel()) for f in sphere_mesh.faces}
    assert all(tuple(np.round(unwrapped.vertices[f], 6).ravel()) in key for f in unwrapped.faces)
    # no face left at a single UV point (xatlas skips tiny faces unless scaled)
    assert (_area(unwrapped.uv[unwrapped.faces]) > 0).all()


def test_baked_texture_reproduces_the_color_field(sphere_mesh):
    size = 256
    textured = bake_texture(sphere_mesh, position_color, texture_size=size)
    assert textured.texture.shape == (size, size, 3) and textured.vertex_colors is None
    assert (textured.texture.reshape(-1, 3).max(1) > 0).all()  # every texel filled: no black seams
    # read the texture at random points inside each face and compare with the field at the 3D point
    rng = np.random.default_rng(0)
    w = rng.dirichlet([1, 1, 1], size=len(textured.faces))
    uv = np.einsum("fk,fkc->fc", w, textured.uv[textured.faces])
    points = np.einsum("fk,fkc->fc", w, textured.vertices[textured.faces])
    x = np.clip((uv[:, 0] * size).astype(int), 0, size - 1)
    y = np.clip(((1 - uv[:, 1]) * size).astype(int), 0, size - 1)
    got = textured.texture[y, x] / 255.0
    expected = position_color(torch.from_numpy(points)).numpy()
    error = np.abs(got - expected).max(1)
    # nearest-texel reading is off by the field's gradient (0.5 per unit length) times the distance to
    # the texel center (under 0.71 texels), plus 8-bit rounding; a texel spans sqrt(area / uv area) / size
    texel = np.sqrt(_area(textured.vertices[textured.faces]).sum() / _area(textured.uv[textured.faces]).sum()) / size
    assert np.percentile(error, 99) < 0.5 * 0.71 * texel + 1 / 255
    assert error.max() < 0.5 * 1.5 * texel + 1 / 255  # UV stretch lets a few read a little farther


def _area(tri: np.ndarray) -> np.ndarray:
    """Areas [F] of triangles [F, 3, 2 or 3]."""
    if tri.shape[-1] == 2:
        tri = np.concatenate([tri, np.zeros(tri.shape[:-1] + (1,))], axis=-1)
    return 0.5 * np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)


def test_bake_refuses_tiny_textures(sphere_mesh):
    with pytest.raises(ValueError, match="texture_size"):
        bake_texture(sphere_mesh, position_color, texture_size=4)


def _rasterize_uv_reference(uvs: np.ndarray, faces: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The texel rasterization one triangle after another in numpy (a later triangle wins a shared texel): the plain
    twin of ``rasterize_uv``."""
    face_id = np.full((size, size), -1, dtype=np.int64)
    bary = np.zeros((size, size, 3), dtype=np.float64)
    uvs = uvs.astype(np.float64)
    px = np.stack([uvs[:, 0] * size, (1.0 - uvs[:, 1]) * size], axis=1)
    for f, corners in enumerate(faces):
        a, b, c = px[corners]
        lo = np.clip(np.floor(np.minimum(np.minimum(a, b), c) - 0.5), 0, size - 1).astype(int)
        hi = np.clip(np.ceil(np.maximum(np.maximum(a, b), c) - 0.5), 0, size - 1).astype(int)
        ys, xs = np.mgrid[lo[1]: hi[1] + 1, lo[0]: hi[0] + 1]
        p = np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], 1)
        v0, v1, v2 = b - a, c - a, p - a
        den = v0[0] * v1[1] - v1[0] * v0[1]
        if abs(den) <= 1e-12:
            continue
        w1 = (v2[:, 0] * v1[1] - v1[0] * v2[:, 1]) / den
        w2 = (v0[0] * v2[:, 1] - v2[:, 0] * v0[1]) / den
        w = np.stack([1 - w1 - w2, w1, w2], 1)
        inside = (w >= -1e-7).all(1)
        face_id[ys.ravel()[inside], xs.ravel()[inside]] = f
        bary[ys.ravel()[inside], xs.ravel()[inside]] = w[inside]
    return face_id, bary


def test_vectorized_texel_rasterization_and_bake_match_the_plain_twin(sphere_mesh):
    """Every texel's triangle and weights as the one-triangle-at-a-time loop finds them (shared edges included: small
    chunks split the triangles into many groups), and the baked texture as baking from those."""
    size = 128
    unwrapped = unwrap_uv(sphere_mesh, texture_size=size)
    reference_id, reference_bary = _rasterize_uv_reference(unwrapped.uv, unwrapped.faces, size)
    for chunk in (2**22, 500):
        face_id, bary = rasterize_uv(unwrapped.uv, unwrapped.faces, size, chunk=chunk)
        assert np.array_equal(face_id, reference_id)
        np.testing.assert_allclose(bary, reference_bary, atol=1e-6)
    covered = reference_id >= 0
    points = (reference_bary[covered][:, :, None] * unwrapped.vertices[unwrapped.faces[reference_id[covered]]]).sum(1)
    image = np.zeros((size, size, 3), np.float32)
    image[covered] = np.clip(position_color(torch.from_numpy(points)).numpy(), 0, 1)
    expected = (fill_empty_texels(image, covered) * 255 + 0.5).astype(np.uint8)
    baked = bake_texture(unwrapped, position_color, texture_size=size).texture
    assert np.abs(baked.astype(int) - expected.astype(int)).max() <= 1  # float32 points: a rounding step at most
