"""Rasterizer core: coverage, barycentrics, depth order, clipping and gradients against brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.render.meshes.raster import interpolate, rasterize, world_to_clip
from tests.mesh_raster_reference import render_reference


def front_camera(width: int = 24, height: int = 20, distance: float = 3.0, fovy_deg: float = 40.0,
                 dtype=torch.float32) -> Cameras:
    """A camera on +z looking at the origin with +y up (world x right, y up in the image)."""
    c2w = look_at(torch.tensor([[0.3, -0.2, distance]]), torch.zeros(1, 3), torch.tensor([[0.0, 1.0, 0.0]]))
    K = intrinsics_from_fovy(torch.tensor([math.radians(fovy_deg)]), width, height)
    return Cameras(c2w.to(dtype), K.to(dtype), width, height)


def random_soup(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centers = (torch.rand(n, 1, 3, generator=g) - 0.5) * torch.tensor([1.6, 1.4, 1.2])
    vertices = (centers + 1.2 * (torch.rand(n, 3, 3, generator=g) - 0.5)).reshape(-1, 3)
    return vertices, torch.arange(3 * n).view(n, 3)


def test_coverage_barycentrics_and_depth_match_ray_casting():
    vertices, faces = random_soup(12, seed=1)
    cams = Cameras.cat([front_camera(), front_camera(distance=2.5)])
    rast = rasterize(world_to_clip(vertices, cams), faces, cams.height, cams.width)
    ref_face, ref_t, ref_bary = render_reference(vertices, faces, cams)
    ids = rast.face_ids().numpy()
    assert (ref_face >= 0).sum() > 100 and len(np.unique(ref_face)) > 8  # overlapping, non-trivial scene
    np.testing.assert_array_equal(ids, ref_face)
    mask = ids >= 0
    depth = rast.to_image(rast.depth[:, None])[..., 0].numpy()
    bary = rast.to_image(rast.barycentrics).numpy()
    np.testing.assert_allclose(depth[mask], ref_t[mask], rtol=1e-5)
    np.testing.assert_allclose(bary[mask], ref_bary[mask], atol=2e-5)
    # interpolating positions gives the ray hit points: perspective-correct interpolation
    points = rast.to_image(interpolate(vertices, rast, faces)).numpy()
    origins, directions = cams.rays(normalized=False)
    hits = origins.numpy() + directions.numpy() * np.where(mask, ref_t, 0)[..., None]
    np.testing.assert_allclose(points[mask], hits[mask], atol=1e-5)


def test_nearest_triangle_wins_whatever_the_face_order():
    square = torch.tensor([[-0.5, -0.5], [0.5, -0.5], [0.0, 0.6]])
    near = torch.cat([square, torch.full((3, 1), 0.4)], -1)
    far = torch.cat([square * 1.5, torch.full((3, 1), -0.4)], -1)
    vertices = torch.cat([near, far])
    cams = front_camera()
    for faces, near_id in ((torch.tensor([[0, 1, 2], [3, 4, 5]]), 0), (torch.tensor([[3, 4, 5], [0, 1, 2]]), 1)):
        rast = rasterize(world_to_clip(vertices, cams), faces, cams.height, cams.width)
        ids = rast.face_ids()[0]
        ref_face, _, _ = render_reference(vertices, faces, cams)
        np.testing.assert_array_equal(ids.numpy(), ref_face[0])
        assert (ids == near_id).sum() > 20 and (ids == 1 - near_id).sum() > 20  # near occludes; far shows around it


def test_triangle_crossing_the_near_plane_is_clipped_not_dropped():
    cams = front_camera(distance=1.0)
    eye = cams.positions[0]
    # a floor-like triangle reaching from behind the camera to far in front of it
    vertices = torch.stack([eye + torch.tensor([-2.0, -0.3, 1.0]), eye + torch.tensor([2.0, -0.3, 1.0]),
                            eye + torch.tensor([0.0, -0.3, -6.0])])
    faces = torch.tensor([[0, 1, 2]])
    near = 0.5
    rast = rasterize(world_to_clip(vertices, cams, near=near, far=50.0), faces, cams.height, cams.width)
    ref_face, ref_t, _ = render_reference(vertices, faces, cams, near=near)
    np.testing.assert_array_equal(rast.face_ids().numpy(), ref_face)
    assert (ref_face >= 0).sum() > 30
    mask = ref_face >= 0
    np.testing.assert_allclose(rast.to_image(rast.depth[:, None])[..., 0].numpy()[mask], ref_t[mask], rtol=1e-5)


def test_chunking_does_not_change_the_result():
    vertices, faces = random_soup(20, seed=2)
    cams = front_camera(32, 32)
    clip = world_to_clip(vertices, cams)
    whole = rasterize(clip, faces, 32, 32)
    pieces = rasterize(clip, faces, 32, 32, max_candidates=7)
    assert torch.equal(whole.pixels, pieces.pixels) and torch.equal(whole.face_index, pieces.face_index)
    assert torch.equal(whole.barycentrics, pieces.barycentrics)


def test_empty_and_offscreen_meshes():
    cams = front_camera()
    vertices = torch.tensor([[10.0, 10.0, 0.0], [11.0, 10.0, 0.0], [10.0, 11.0, 0.0],
                             [0.0, 0.0, 9.0], [1.0, 0.0, 9.0], [0.0, 1.0, 9.0]])
    rast = rasterize(world_to_clip(vertices, cams), torch.tensor([[0, 1, 2], [3, 4, 5]]), cams.height, cams.width)
    assert rast.pixels.numel() == 0 and (rast.face_ids() == -1).all()
    rast = rasterize(world_to_clip(vertices, cams), torch.zeros(0, 3, dtype=torch.long), cams.height, cams.width)
    assert rast.pixels.numel() == 0


def test_bad_inputs_name_the_problem():
    cams = front_camera()
    with pytest.raises(ValueError, match="world_to_clip"):
        rasterize(torch.zeros(5, 3), torch.tensor([[0, 1, 2]]), 8, 8)
    with pytest.raises(ValueError, match="outside"):
        rasterize(world_to_clip(torch.zeros(3, 3), cams), torch.tensor([[0, 1, 3]]), 8, 8)
    with pytest.raises(ValueError, match="integer"):
        rasterize(world_to_clip(torch.zeros(3, 3), cams), torch.tensor([[0.0, 1.0, 2.0]]), 8, 8)


def test_interpolation_gradients_match_finite_differences():
    """d(image)/d(vertex positions, attributes) inside triangles, float64 finite differences."""
    cams = front_camera(12, 10, dtype=torch.float64)
    vertices = 1.6 * torch.tensor([[-0.6, -0.5, 0.1], [0.7, -0.4, -0.2], [0.0, 0.6, 0.3], [0.8, 0.5, -0.4]], dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2], [1, 3, 2]])
    attributes = torch.rand(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    weights = torch.rand(1, 10, 12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mask = rasterize(world_to_clip(vertices, cams), faces, 10, 12).mask()
    assert mask.sum() > 30

    def loss(v, a):
        rast = rasterize(world_to_clip(v, cams), faces, 10, 12)
        assert torch.equal(rast.mask(), mask)  # finite differences must not flip coverage
        return (rast.to_image(interpolate(a, rast, faces)) * weights).sum()

    assert torch.autograd.gradcheck(loss, (vertices.requires_grad_(), attributes.requires_grad_()), eps=1e-6, atol=1e-6)


def test_face_corner_and_batched_attributes():
    vertices, faces = random_soup(4, seed=3)
    cams = Cameras.cat([front_camera(), front_camera(distance=2.0)])
    rast = rasterize(world_to_clip(vertices, cams), faces, cams.height, cams.width)
    colors = torch.rand(vertices.shape[0], 3)
    per_vertex = interpolate(colors, rast, faces)
    per_corner = interpolate(colors[faces], rast, None)
    batched = interpolate(colors.expand(2, -1, -1), rast, faces)
    torch.testing.assert_close(per_vertex, per_corner)
    torch.testing.assert_close(per_vertex, batched)
