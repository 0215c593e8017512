"""The pure-PyTorch surfel rasterizer against a brute-force per-pixel reference (tests/surfel_reference.py) on a tiny
scene: images, alpha, depths, median depth, distortion, normals and their gradients; its screen boxes against sampled
ellipses; normals from depth of a plane; the part's config errors."""

from __future__ import annotations

import math

import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.config import ConfigError
from lift3d.registry import find
from lift3d.render.splats.renderer import Splats
from lift3d.render.surfels.project import project_surfels
from lift3d.render.surfels.renderer import normals_from_depth, rasterize_surfels
from lift3d.render.surfels.torch_backend import rasterize_surfels_torch
from lift3d.rotations import quaternion_to_matrix
from tests.surfel_reference import reference_render

WIDTH, HEIGHT = 27, 21  # not multiples of the tile size


def _cameras(n: int = 2, distance: float = 2.2, dtype: torch.dtype = torch.float32) -> Cameras:
    eyes = torch.nn.functional.normalize(torch.tensor([[3.0, 0.3, 0.8], [2.2, -1.8, 1.2], [2.0, 1.5, 2.0]], dtype=dtype)[:n],
                                         dim=-1) * distance
    c2w = look_at(eyes, torch.zeros(n, 3, dtype=dtype), torch.tensor([0.0, 0.0, 1.0], dtype=dtype).expand(n, 3))
    fovy = torch.full((n,), math.radians(35.0), dtype=dtype)
    return Cameras(c2w, intrinsics_from_fovy(fovy, WIDTH, HEIGHT), WIDTH, HEIGHT)


def _double(cameras: Cameras) -> tuple[torch.Tensor, torch.Tensor]:
    """(viewmats, Ks) of the same cameras made in float64 (rotations orthonormal to its precision: the reference's
    projections onto the surfel axes assume it)."""
    twin = _cameras(len(cameras), dtype=torch.float64)
    return twin.w2c_opencv(), twin.intrinsics


def _scene(n: int = 40, seed: int = 0) -> dict[str, torch.Tensor]:
    """Surfels inside every view, each a few pixels wide and turned at most about 30 degrees from the first camera
    (none seen edge-on: its low-pass filter would then reach past its box, where the tiles do not composite it)."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) - 0.5) * 0.7
    toward = torch.nn.functional.normalize(torch.tensor([3.0, 0.3, 0.8]), dim=0)
    tilt = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1) * 0.5
    means[:4], tilt[:4] = toward * torch.tensor([0.3, 0.15, 0.0, -0.15])[:, None], 0.0  # an opaque stack: pixels finish
    normal = torch.nn.functional.normalize(toward + tilt, dim=-1)
    axis = torch.nn.functional.normalize(torch.linalg.cross(torch.tensor([0.0, 0.0, 1.0]).expand(n, 3), normal), dim=-1)
    angle = torch.acos((normal * torch.tensor([0.0, 0.0, 1.0])).sum(-1).clamp(-1, 1))  # rotate +z onto the normal
    quats = torch.cat([torch.cos(angle / 2)[:, None], torch.sin(angle / 2)[:, None] * axis], dim=-1)
    twist = torch.rand(n, generator=g) * math.pi  # then spin about the normal
    spin = torch.stack([torch.cos(twist / 2), 0 * twist, 0 * twist, torch.sin(twist / 2)], -1)
    w1, v1 = quats[:, :1], quats[:, 1:]
    w2, v2 = spin[:, :1], spin[:, 1:]
    quats = torch.cat([w1 * w2 - (v1 * v2).sum(-1, keepdim=True), w1 * v2 + w2 * v1 + torch.linalg.cross(v1, v2)], -1)
    return {"means": means, "quats": quats * (1 + torch.rand(n, 1, generator=g)),  # any norm
            "scales": torch.cat([0.05 + 0.1 * torch.rand(n, 2, generator=g), torch.full((n, 1), 5.0)], -1),  # 3rd: ignored
            "opacities": torch.cat([torch.full((4,), 0.99), 0.5 + 0.49 * torch.rand(n - 4, generator=g)]),
            "colors": torch.rand(n, 3, generator=g)}


def _leaves(scene: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone().double().requires_grad_() for k, v in scene.items()}


def test_screen_boxes_are_those_of_the_projected_ellipses():
    scene, cameras = _scene(), _cameras()
    proj = project_surfels(scene["means"].double(), scene["quats"].double(), scene["scales"].double(),
                           *_double(cameras), WIDTH, HEIGHT)
    rot = quaternion_to_matrix(scene["quats"].double())
    angles = torch.linspace(0, 2 * math.pi, 20001, dtype=torch.float64)
    circle = torch.stack([torch.cos(angles), torch.sin(angles)], -1)  # the 1-sigma edge in surfel coordinates
    for c, (view, K) in enumerate(zip(*_double(cameras))):
        scales = scene["scales"].double()
        edge = circle[None, :, 0, None] * rot[:, None, :, 0] * scales[:, None, 0:1] + \
            circle[None, :, 1, None] * rot[:, None, :, 1] * scales[:, None, 1:2] + scene["means"].double()[:, None]
        cam = edge @ view[:3, :3].T + view[:3, 3]
        pixels = torch.stack([K[0, 0] * cam[..., 0] / cam[..., 2] + K[0, 2], K[1, 1] * cam[..., 1] / cam[..., 2] + K[1, 2]], -1)
        low, high = pixels.amin(1), pixels.amax(1)
        torch.testing.assert_close(proj.means2d[c], (low + high) / 2, atol=1e-4, rtol=0)
        expected = torch.ceil(3.33 * (high - low) / 2)
        assert (proj.radii[c] - expected).abs().max() <= 1  # ceil() of sampled sizes may round the other way
        assert (proj.radii[c] > 0).all()  # every surfel is in view: the reference composites them all
    view = _double(cameras)[0][0]
    depth = scene["means"].double() @ view[:3, :3].T + view[:3, 3]
    torch.testing.assert_close(proj.depths[0], depth[:, 2])


@pytest.mark.parametrize("tile_size, chunk_elements, save_elements, low_pass",
                         [(16, 1 << 22, 1 << 26, 2.0), (4, 600, 0, 2.0), (8, 1 << 22, 1 << 26, 20.0)])
def test_torch_rasterizer_matches_the_brute_force_reference(tile_size, chunk_elements, save_elements, low_pass):
    """Images, depths and normals, and the gradients of all of them, in one piece and in many small checkpointed
    chunks of few tiles (save_elements=0: every chunk is recomputed in the backward pass), with 2DGS's low-pass filter
    and a sharper one."""
    scene, cameras = _scene(), _cameras()
    viewmats, Ks = _double(cameras)
    ours, ref = _leaves(scene), _leaves(scene)
    out = rasterize_surfels_torch(ours["means"], ours["quats"], ours["scales"], ours["opacities"], ours["colors"],
                                  viewmats, Ks, WIDTH, HEIGHT, torch.zeros(2, 3, dtype=torch.float64),
                                  tile_size=tile_size, chunk_elements=chunk_elements, save_elements=save_elements,
                                  low_pass=low_pass)
    centers = project_surfels(ref["means"], ref["quats"], ref["scales"], viewmats, Ks, WIDTH, HEIGHT).means2d
    expected = reference_render(ref["means"], ref["quats"], ref["scales"], ref["opacities"], ref["colors"], viewmats, Ks,
                                WIDTH, HEIGHT, centers, low_pass=low_pass)
    assert expected["alpha"].max() > 0.95 and (expected["alpha"] < 1e-6).float().mean() > 0.1  # opaque spots and gaps
    assert (expected["median"] > 0).float().mean() > 0.2 and expected["distortion"].max() > 1e-3
    assert (1 - expected["alpha"] < 2e-4).any()  # some pixels finished before their last surfel
    g = torch.Generator().manual_seed(1)
    loss_ours, loss_ref = 0.0, 0.0
    for key, ours_key in (("rgb", "render"), ("alpha", "alpha"), ("depth_sum", "depth_sum"), ("median", "median"),
                          ("distortion", "distortion"), ("normal", "normal")):
        torch.testing.assert_close(out[ours_key], expected[key], atol=1e-9, rtol=1e-7, msg=key)
        weights = torch.rand(expected[key].shape, generator=g, dtype=torch.float64)
        loss_ours = loss_ours + (weights * out[ours_key]).sum()
        loss_ref = loss_ref + (weights * expected[key]).sum()
    loss_ours.backward()
    loss_ref.backward()
    for name in scene:
        assert ref[name].grad.abs().max() > 0, name
        torch.testing.assert_close(ours[name].grad, ref[name].grad, atol=1e-8, rtol=1e-6, msg=name)


def test_the_densification_gradient_moves_the_surfel_sideways_at_its_depth():
    """``densify_grad`` is dL/d(the surfel's plane moved by one pixel in the image at its depth), its filter and depth
    kept (gsplat's gradient_2dgs)."""
    scene, cameras = _scene(), _cameras()
    viewmats, Ks = _double(cameras)
    ours = _leaves(scene)
    out = rasterize_surfels_torch(ours["means"], ours["quats"], ours["scales"], ours["opacities"], ours["colors"],
                                  viewmats, Ks, WIDTH, HEIGHT, torch.zeros(2, 3, dtype=torch.float64), tile_size=8)
    weights = torch.rand(out["render"].shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (weights * out["render"]).sum().backward()
    shift = torch.zeros(2, len(scene["means"]), 2, dtype=torch.float64, requires_grad=True)
    d = {k: v.double() for k, v in scene.items()}
    centers = project_surfels(d["means"], d["quats"], d["scales"], viewmats, Ks, WIDTH, HEIGHT).means2d
    ref = reference_render(d["means"], d["quats"], d["scales"], d["opacities"], d["colors"], viewmats, Ks, WIDTH, HEIGHT,
                           centers, shift=shift)
    (weights * ref["rgb"]).sum().backward()
    assert shift.grad.abs().max() > 1e-3
    torch.testing.assert_close(out["densify_grad"], shift.grad, atol=1e-8, rtol=1e-6)


def test_the_tile_size_changes_only_the_faint_rims_of_edge_on_surfels():
    scene, cameras = _scene(60, seed=3), _cameras(3)
    surfels = Splats(scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["colors"][:, None])
    a = rasterize_surfels(surfels, cameras, torch.tensor([0.2, 0.4, 0.9]), backend="torch", tile_size=16)
    b = rasterize_surfels(surfels, cameras, torch.tensor([0.2, 0.4, 0.9]), backend="torch", tile_size=4,
                          chunk_elements=2000)
    for key in ("rgb", "alpha", "normal", "distortion"):
        # a surfel seen almost edge-on has a box a pixel thin while its low-pass filter reaches 2.4 px: the tiles its
        # box touches (which the tile size sets, in gsplat too) decide where that faint rim is composited
        gap = (a[key] - b[key]).abs().amax(-1)
        assert gap.max() < 0.02 and (gap > 2e-5).float().mean() < 0.01, key
    empty = a["alpha"][..., 0] < 1e-6
    assert empty.any() and torch.allclose(a["rgb"][empty], torch.tensor([0.2, 0.4, 0.9]))  # the background shows
    assert (a["depth"][empty] == 0).all() and (a["median_depth"][empty] == 0).all()


def test_normals_from_depth_of_a_tilted_plane_face_the_camera():
    cameras = _cameras(1)
    normal = torch.nn.functional.normalize(torch.tensor([1.0, 0.2, 0.6]), dim=0)  # a plane through the origin
    origins, directions = cameras.rays(normalized=False)
    depth = -(origins * normal).sum(-1, keepdim=True) / (directions * normal).sum(-1, keepdim=True)
    normals = normals_from_depth(depth, cameras)
    inner = normals[:, 1:-1, 1:-1].reshape(-1, 3)
    torch.testing.assert_close(inner, normal.expand_as(inner), atol=1e-4, rtol=0)  # the camera is on the +normal side
    assert (normals[:, 0] == 0).all() and (normals[:, :, -1] == 0).all()


def test_a_surfel_facing_away_still_shows_its_normal_toward_the_camera():
    cameras = _cameras(1)
    camera = cameras.positions[0]
    facing = torch.nn.functional.normalize(-camera, dim=0)  # +z of the surfel points away from the camera
    axis = torch.nn.functional.normalize(torch.linalg.cross(torch.tensor([0.0, 0.0, 1.0]), facing), dim=0)
    angle = torch.acos(facing[2])
    quat = torch.cat([torch.cos(angle / 2)[None], torch.sin(angle / 2) * axis])[None]
    surfel = Splats(torch.zeros(1, 3), quat, torch.tensor([[0.3, 0.3, 1.0]]), torch.tensor([0.9]), torch.ones(1, 1, 3))
    out = rasterize_surfels(surfel, cameras, backend="torch")
    center = out["normal"][0, HEIGHT // 2, WIDTH // 2]
    torch.testing.assert_close(center / center.norm(), -facing, atol=1e-5, rtol=0)
    torch.testing.assert_close(out["surface_normal"][0, HEIGHT // 2, WIDTH // 2], -facing, atol=1e-3, rtol=0)


def test_surfel_renderer_config_errors():
    with pytest.raises(ConfigError, match="surface_depth must be one of expected, median"):
        find("surfel-rasterizer")({"surface_depth": "mean"})
    with pytest.raises(ConfigError, match="tile_size"):
        find("surfel-rasterizer")({"tile_size": 0})
    with pytest.raises(ValueError, match="needs CUDA"):
        rasterize_surfels(Splats(torch.zeros(1, 3), torch.tensor([[1.0, 0, 0, 0]]), torch.ones(1, 3), torch.ones(1),
                                 torch.ones(1, 1, 3)), _cameras(1), backend="gsplat")


def test_float32_renders_agree_with_float64_where_edge_on_surfels_are_common():
    """Each pixel's plane coordinates are evaluated before they are squared: the expanded square of an edge-on
    surfel's coordinates cancelled to a fraction of float32's precision and flipped a few pixels by up to 0.03."""
    from tests.render.surfels.test_parity_gpu import _cameras as parity_cameras
    from tests.render.surfels.test_parity_gpu import _scene as parity_scene

    cpu = torch.device("cpu")
    scene, cameras = parity_scene(800, seed=800, device=cpu), parity_cameras(96, 72, device=cpu)
    background = torch.rand(3, 3, generator=torch.Generator().manual_seed(1))
    doubles = Splats(*(t.double() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)))
    cameras64 = Cameras(cameras.c2w.double(), cameras.intrinsics.double(), cameras.width, cameras.height)
    with torch.no_grad():
        single = rasterize_surfels(scene, cameras, background, sh_degree=3, backend="torch")
        double = rasterize_surfels(doubles, cameras64, background.double(), sh_degree=3, backend="torch")
    for key in ("rgb", "alpha", "normal", "median_depth"):
        gap = (single[key].double() - double[key]).abs().amax(-1)
        assert gap.max() < 1e-3 and (gap > 1e-4).float().mean() < 1e-3, (key, float(gap.max()))


def test_rays_almost_parallel_to_a_surfel_give_finite_gradients():
    """A ray that grazes a surfel's plane puts |s|^2 past float32's range; its alpha is the low-pass filter's and
    every gradient stays finite (an overflow to inf met the minimum with the low-pass filter as 0 x inf = NaN, and one NaN surfel
    then stayed in a trained model)."""
    from lift3d.render.surfels.composite import surfel_alphas

    # rows: zeta_u, zeta_v, zeta_w (the depth), the filter; over the monomials (1, u, v, u^2, uv, v^2)
    coefficients = torch.zeros(1, 2, 4, 6)
    coefficients[0, :, 0, 0] = 1e3  # zeta_u
    coefficients[0, 0, 2, 0] = 1e-30  # zeta_w^2 underflows: the ray runs along the plane
    coefficients[0, 1, 2, 0] = 1e3  # a surfel the ray meets where |s| = 1
    coefficients[0, :, 3, 0] = 1.0  # the filter's 2 |pixel - center|^2
    coefficients.requires_grad_(True)
    opacity = torch.full((1, 2), 0.9, requires_grad=True)
    monomials = torch.tensor([[1.0, 0.5, 0.5, 0.25, 0.25, 0.25]])
    alpha = surfel_alphas(coefficients, opacity, monomials)
    # the low-pass filter (2 |pixel - center|^2 = 1) is the smaller term of both: the grazing surfel shows as a dot
    assert alpha.detach()[0, :, 0].tolist() == pytest.approx([0.9 * math.exp(-0.5)] * 2, rel=1e-5)
    (alpha * torch.tensor([1.0, 2.0])[None, :, None]).sum().backward()
    assert torch.isfinite(coefficients.grad).all() and torch.isfinite(opacity.grad).all()
    assert coefficients.grad[0, 1].abs().sum() > 0


def _sphere_of_surfels(radius: float, n: int) -> Splats:
    """``n`` opaque surfels tangent to a sphere of ``radius`` at the origin (a Fibonacci spread), as wide as their
    spacing."""
    from lift3d.gaussians.surfels import rotations_facing

    i = torch.arange(n, dtype=torch.float64) + 0.5
    z = 1 - 2 * i / n
    azimuth = math.pi * (1 + 5**0.5) * i
    ring = torch.sqrt(1 - z * z)
    normals = torch.stack([ring * torch.cos(azimuth), ring * torch.sin(azimuth), z], -1).float()
    spacing = radius * math.sqrt(4 * math.pi / n)
    return Splats(radius * normals, rotations_facing(normals, torch.Generator().manual_seed(0)),
                  torch.full((n, 3), 0.6 * spacing), torch.full((n,), 0.99), torch.zeros(n, 1, 3))


def test_a_sharper_low_pass_filter_keeps_a_silhouette_of_small_surfels_on_the_surface():
    """Surfels tangent to a sphere, many of them under a pixel edge-on at its rim: 2DGS's filter (2) spreads the
    silhouette past the sphere's, a sharper one (20) much less; where both cover, the depths are alike."""
    radius, size = 0.6, 64
    cameras = Cameras(look_at(torch.tensor([[0.0, -2.5, 0.4]]), torch.zeros(1, 3), torch.tensor([0.0, 0.0, 1.0])),
                      intrinsics_from_fovy(torch.tensor([math.radians(40.0)]), size, size), size, size)
    surfels = _sphere_of_surfels(radius, 6000)
    # the true silhouette: pixel centers whose ray passes within the radius of the center
    ys, xs = torch.meshgrid(torch.arange(size) + 0.5, torch.arange(size) + 0.5, indexing="ij")
    K = cameras.intrinsics[0]
    rays = torch.stack([(xs - K[0, 2]) / K[0, 0], (ys - K[1, 2]) / K[1, 1], torch.ones_like(xs)], -1)
    rays = rays / rays.norm(dim=-1, keepdim=True)
    center = cameras.w2c_opencv()[0, :3, 3]  # the sphere's center in camera coordinates
    along = rays @ center
    truth = (center.norm() ** 2 - along**2) < radius**2
    masks, depths = {}, {}
    for low_pass in (2.0, 20.0):
        out = rasterize_surfels(surfels, cameras, torch.zeros(3), sh_degree=0, backend="torch", tile_size=8,
                                low_pass=low_pass)
        masks[low_pass], depths[low_pass] = out["alpha"][0, ..., 0] > 0.5, out["median_depth"][0, ..., 0]
    extra = {k: int((m & ~truth).sum()) for k, m in masks.items()}
    missing = {k: int((~m & truth).sum()) for k, m in masks.items()}
    rim = 2 * math.pi * math.sqrt(int(truth.sum()) / math.pi)  # the silhouette's length in pixels
    assert extra[2.0] > 0.8 * rim and extra[20.0] < 0.5 * extra[2.0], (extra, rim)
    assert missing[20.0] < 0.05 * rim, missing
    both = masks[2.0] & masks[20.0] & truth
    assert (depths[2.0][both] - depths[20.0][both]).abs().median() < 0.01


def test_gsplat_is_refused_a_low_pass_filter_it_does_not_have():
    cameras, scene = _cameras(1), _scene(5)
    surfels = Splats(scene["means"], scene["quats"], scene["scales"], scene["opacities"], scene["colors"][:, None])
    with pytest.raises(ValueError, match="fixes its low-pass filter at 2"):
        rasterize_surfels(surfels, cameras, backend="gsplat", low_pass=8.0)
    # auto renders it with PyTorch, wherever it runs
    assert rasterize_surfels(surfels, cameras, sh_degree=0, low_pass=8.0)["alpha"].max() > 0
    with pytest.raises(ConfigError, match="system.renderer.low_pass=2, or system.renderer.backend=torch"):
        find("surfel-rasterizer")({"backend": "gsplat", "low_pass": 20.0})
