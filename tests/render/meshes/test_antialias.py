"""Silhouette antialiasing: box-filter coverage at edges, gradients to vertex positions, continuity."""

from __future__ import annotations

import numpy as np
import torch

from lift3d.render.meshes.antialias import antialias
from lift3d.render.meshes.raster import interpolate, rasterize, world_to_clip
from tests.render.meshes.test_raster import front_camera

SIZE = 32


def pixel_clip(points: torch.Tensor, size: int = SIZE) -> torch.Tensor:
    """Clip positions [1, V, 4] (w = 1) of points given in pixel coordinates [V, 2] (x right, y down)."""
    x = 2.0 * points[:, 0] / size - 1.0
    y = 1.0 - 2.0 * points[:, 1] / size
    return torch.stack([x, y, torch.zeros_like(x), torch.ones_like(x)], -1).unsqueeze(0)


def coverage_alpha(clip: torch.Tensor, faces: torch.Tensor, size: int = SIZE, aa: bool = True) -> torch.Tensor:
    rast = rasterize(clip, faces, size, size)
    hard = rast.to_image(torch.ones(rast.pixels.numel(), 1, dtype=clip.dtype))
    return antialias(hard, rast, clip, faces)[0, ..., 0] if aa else hard[0, ..., 0]


def box_coverage(triangle: np.ndarray, i: int, j: int) -> float:
    """Exact area of triangle [3, 2] inside pixel box [i, i+1] x [j, j+1] (Sutherland-Hodgman + shoelace)."""
    polygon = [tuple(p) for p in triangle]
    for axis, bound, keep_less in ((0, i, False), (0, i + 1, True), (1, j, False), (1, j + 1, True)):
        def inside(p, a=axis, b=bound, k=keep_less):
            return (p[a] <= b if k else p[a] >= b)
        clipped = []
        for k, current in enumerate(polygon):
            previous = polygon[k - 1]
            if inside(current) != inside(previous):
                t = (bound - previous[axis]) / (current[axis] - previous[axis])
                clipped.append(tuple(previous[c] + t * (current[c] - previous[c]) for c in range(2)))
            if inside(current):
                clipped.append(current)
        polygon = clipped
        if not polygon:
            return 0.0
    p = np.array(polygon)
    return 0.5 * abs(np.dot(p[:, 0], np.roll(p[:, 1], -1)) - np.dot(p[:, 1], np.roll(p[:, 0], -1)))


def test_antialiased_alpha_is_the_box_filtered_coverage_along_an_edge():
    triangle = np.array([[3.3, 1.0], [6.1, 30.0], [28.0, 15.0]])  # edge 0-1 steep, far from the others in rows 10..22
    clip, faces = pixel_clip(torch.tensor(triangle, dtype=torch.float64)), torch.tensor([[0, 1, 2]])
    alpha, hard = coverage_alpha(clip, faces), coverage_alpha(clip, faces, aa=False)
    exact = np.array([[box_coverage(triangle, i, j) for i in range(SIZE)] for j in range(SIZE)])
    region = (slice(10, 23), slice(0, 12))
    err_aa = np.abs(alpha.numpy()[region] - exact[region])
    err_hard = np.abs(hard.numpy()[region] - exact[region])
    partial = (exact[region] > 0.02) & (exact[region] < 0.98)
    assert partial.sum() >= 10  # the edge crosses (almost) every row of the region with partial coverage
    assert err_aa.max() < 0.01, err_aa.max()
    assert err_hard[partial].mean() > 0.15  # without antialiasing the same pixels are far off
    # summed over the image, antialiased coverage is close to the exact area (errors only near corners)
    assert abs(alpha.sum().item() - exact.sum()) < 0.02 * exact.sum()


def test_silhouette_gradient_matches_finite_differences_and_area_derivative():
    triangle = torch.tensor([[4.2, 3.1], [27.6, 9.3], [11.7, 28.4]], dtype=torch.float64, requires_grad=True)
    faces = torch.tensor([[0, 1, 2]])
    total = coverage_alpha(pixel_clip(triangle), faces).sum()
    (grad,) = torch.autograd.grad(total, triangle)
    hard = coverage_alpha(pixel_clip(triangle.detach()), faces, aa=False)
    # without antialiasing coverage does not depend on the positions at all; with it, it does
    assert not hard.requires_grad and grad.abs().min() > 1.0
    # analytic derivative of the triangle's area: the box-filtered coverage sums to the area
    exact = triangle.detach().clone().requires_grad_()
    u, v = exact[1] - exact[0], exact[2] - exact[0]
    (area_grad,) = torch.autograd.grad(0.5 * (u[0] * v[1] - u[1] * v[0]).abs(), exact)
    assert abs(total.item() - 0.5 * abs((u[0] * v[1] - u[1] * v[0]).item())) < 0.5
    torch.testing.assert_close(grad, area_grad, rtol=0.1, atol=1.0)  # corners are approximate
    # finite differences of the antialiased image (no pixel center flips within eps)
    for vertex in range(3):
        for axis in range(2):
            eps = 1e-6
            moved = []
            for step in (eps, -eps):
                t = triangle.detach().clone()
                t[vertex, axis] += step
                assert torch.equal(coverage_alpha(pixel_clip(t), faces, aa=False), hard)
                moved.append(coverage_alpha(pixel_clip(t), faces).sum().item())
            fd = (moved[0] - moved[1]) / (2 * eps)
            assert abs(fd - grad[vertex, axis].item()) < 1e-5 * max(1.0, abs(fd))


def test_world_space_silhouette_gradient_matches_finite_differences():
    """Perspective camera, colored triangle over a background: the full image's gradient to vertices."""
    cams = front_camera(20, 16, dtype=torch.float64)
    vertices = torch.tensor([[-0.7, -0.45, 0.1], [0.75, -0.3, -0.2], [0.05, 0.62, 0.3]], dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2]])
    colors = torch.tensor([[1.0, 0.2, 0.1], [0.1, 0.9, 0.3], [0.2, 0.3, 1.0]], dtype=torch.float64)
    background = torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64)
    weights = torch.rand(1, 16, 20, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))

    def image(v, aa=True):
        clip = world_to_clip(v, cams)
        rast = rasterize(clip, faces, 16, 20)
        hard = rast.to_image(torch.ones(rast.pixels.numel(), 1, dtype=v.dtype))
        rgb = rast.to_image(interpolate(colors, rast, faces)) + (1 - hard) * background
        return (antialias(rgb, rast, clip, faces) if aa else rgb), hard

    base_hard = image(vertices)[1]
    vertices.requires_grad_()
    (grad,) = torch.autograd.grad((image(vertices)[0] * weights).sum(), vertices)
    (grad_no_aa,) = torch.autograd.grad((image(vertices, aa=False)[0] * weights).sum(), vertices)
    assert (grad - grad_no_aa).abs().max() > 1.0  # the silhouette term is there
    for vertex in range(3):
        for axis in range(3):
            values = []
            for step in (1e-6, -1e-6):
                v = vertices.detach().clone()
                v[vertex, axis] += step
                rgb, hard = image(v)
                assert torch.equal(hard, base_hard)
                values.append((rgb * weights).sum().item())
            fd = (values[0] - values[1]) / 2e-6
            assert abs(fd - grad[vertex, axis].item()) < 1e-5 * max(1.0, abs(fd)), (vertex, axis, fd, grad[vertex, axis])


def test_coverage_is_continuous_when_a_pixel_center_crosses_an_edge():
    """Moving a vertex until the rasterized coverage flips: the antialiased image does not jump."""
    base = torch.tensor([[4.2, 3.1], [27.6, 9.3], [11.7, 28.4]], dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2]])

    def at(x: float) -> torch.Tensor:
        t = base.clone()
        t[2, 0] = x
        return pixel_clip(t)

    low, high = 11.7, 12.4
    assert not torch.equal(coverage_alpha(at(low), faces, aa=False), coverage_alpha(at(high), faces, aa=False))
    reference = coverage_alpha(at(low), faces, aa=False)
    for _ in range(60):  # bisect to the position where some pixel center changes side
        mid = 0.5 * (low + high)
        if torch.equal(coverage_alpha(at(mid), faces, aa=False), reference):
            low = mid
        else:
            high = mid
    hard_jump = (coverage_alpha(at(high), faces, aa=False) - coverage_alpha(at(low), faces, aa=False)).abs().max()
    aa_jump = (coverage_alpha(at(high), faces) - coverage_alpha(at(low), faces)).abs().max()
    assert hard_jump == 1.0 and aa_jump < 1e-5, (hard_jump, aa_jump)


def test_interior_edges_are_not_blended():
    """A quad of two differently colored triangles: only pixels on its outline change."""
    quad = torch.tensor([[5.3, 4.6], [26.2, 6.1], [24.8, 27.3], [6.4, 25.9]], dtype=torch.float64)
    faces = torch.tensor([[0, 1, 2], [0, 2, 3]])
    clip = pixel_clip(quad)
    rast = rasterize(clip, faces, SIZE, SIZE)
    colors = torch.tensor([[[1.0, 0.0, 0.0]] * 3, [[0.0, 1.0, 0.0]] * 3], dtype=torch.float64)
    rgb = rast.to_image(interpolate(colors, rast, None))
    out = antialias(rgb, rast, clip, faces)
    covered = rast.mask()[0]
    padded = torch.nn.functional.pad(covered[None, None].double(), (1, 1, 1, 1))[0, 0]
    interior = covered & (padded[:-2, 1:-1] > 0) & (padded[2:, 1:-1] > 0) & (padded[1:-1, :-2] > 0) & (padded[1:-1, 2:] > 0)
    ids = rast.face_ids()[0]
    assert ((ids[:, 1:] != ids[:, :-1]) & interior[:, 1:] & interior[:, :-1]).sum() > 10  # the diagonal is inside
    torch.testing.assert_close(out[0][interior], rgb[0][interior], rtol=0, atol=0)
    assert (out[0][~interior] - rgb[0][~interior]).abs().sum() > 1.0  # the outline is antialiased


def test_closed_mesh_silhouette_gradient_matches_finite_differences():
    """A low-poly sphere: silhouettes run along edges between front and back faces, often through
    triangles no pixel center sees; directional derivatives of the antialiased coverage match FD."""
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=1, radius=0.8)
    vertices = torch.tensor(sphere.vertices, dtype=torch.float64)
    faces = torch.tensor(sphere.faces, dtype=torch.long)
    cams = front_camera(24, 24, dtype=torch.float64)
    weights = torch.rand(1, 24, 24, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))

    def loss(v):
        clip = world_to_clip(v, cams)
        rast = rasterize(clip, faces, 24, 24)
        hard = rast.to_image(torch.ones(rast.pixels.numel(), 1, dtype=v.dtype))
        return (antialias(hard, rast, clip, faces) * weights).sum(), rast.mask()

    v = vertices.clone().requires_grad_()
    value, mask = loss(v)
    (grad,) = torch.autograd.grad(value, v)
    assert (grad.norm(dim=-1) > 1e-3).sum() >= 8  # silhouette vertices receive gradients
    g = torch.Generator().manual_seed(4)
    for _ in range(4):
        direction = torch.randn(vertices.shape, dtype=torch.float64, generator=g)
        eps = 1e-7
        up, mask_up = loss(vertices + eps * direction)
        down, mask_down = loss(vertices - eps * direction)
        assert torch.equal(mask_up, mask) and torch.equal(mask_down, mask)
        fd = (up - down).item() / (2 * eps)
        analytic = (grad * direction).sum().item()
        assert abs(fd - analytic) < 1e-4 * max(1.0, abs(fd)), (fd, analytic)
