"""Spot, textured through its UVs, rendered by the mesh renderer and by brute-force ray casting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.meshes.io import load_mesh
from lift3d.meshes.mesh import Mesh
from lift3d.registry import find
from lift3d.render.meshes.renderer import sample_texture
from tests.mesh_raster_reference import bilinear, render_reference

WIDTH, HEIGHT = 40, 32


@pytest.fixture(scope="module")
def spot(data_dir):
    folder = data_dir / "meshes" / "spot"
    return load_mesh(folder / "spot.obj", texture_path=folder / "spot_texture.png")


@pytest.fixture(scope="module")
def cameras():
    c2w = orbit_c2w(2, elevation_deg=25.0, distance=1.4, start_azimuth_deg=40.0)
    return Cameras(c2w, intrinsics_from_fovy(torch.full((2,), math.radians(45.0)), WIDTH, HEIGHT), WIDTH, HEIGHT)


def test_spot_render_matches_ray_casting(spot, cameras):
    renderer = find("mesh-rasterizer")({"antialias": False, "normal_type": "face", "background_color": [0.0, 0.0, 1.0]})
    out = renderer(spot, cameras)
    ref_face, ref_t, ref_bary = render_reference(spot.vertices, spot.faces, cameras, near=renderer.cfg.near)
    ids = out["face_ids"].numpy()
    covered = ref_face >= 0
    assert covered.sum() > 0.2 * covered.size  # the cow fills a good part of the view
    same = ids == ref_face
    assert same.mean() > 0.998, same.mean()  # only pixel centers on shared edges may pick the other face
    hit = covered & same

    uv = (ref_bary[..., None] * spot.uv.double().numpy()[spot.uv_faces.numpy()[np.maximum(ref_face, 0)]]).sum(-2)
    texels = bilinear(spot.texture.double().numpy(), uv.reshape(-1, 2)).reshape(uv.shape[:-1] + (3,))
    ref_rgb = np.where(covered[..., None], texels, [0.0, 0.0, 1.0])
    v = spot.vertices.double().numpy()[spot.faces.numpy()]
    n = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    ref_normal = n[np.maximum(ref_face, 0)] / np.linalg.norm(n[np.maximum(ref_face, 0)], axis=-1, keepdims=True)

    np.testing.assert_allclose(out["rgb"].numpy()[hit], ref_rgb[hit], atol=2e-4)
    np.testing.assert_allclose(out["rgb"].numpy()[~covered], ref_rgb[~covered], atol=0)
    np.testing.assert_allclose(out["depth"][..., 0].numpy()[hit], ref_t[hit], rtol=1e-5)
    np.testing.assert_allclose(out["normal"].numpy()[hit], ref_normal[hit], atol=1e-4)
    np.testing.assert_array_equal(out["alpha"][..., 0].numpy() > 0.5, covered)
    assert out["rgb"].numpy()[hit].std() > 0.1  # the texture shows (black patches on white)


def test_spot_antialiasing_touches_only_silhouettes(spot, cameras):
    hard = find("mesh-rasterizer")({"antialias": False})(spot, cameras)
    soft = find("mesh-rasterizer")({"antialias": True})(spot, cameras)
    changed = (soft["rgb"] - hard["rgb"]).abs().amax(-1) > 1e-6
    ids = hard["face_ids"]
    padded = torch.nn.functional.pad(ids, (1, 1, 1, 1), value=-2)
    neighbor_differs = torch.zeros_like(changed)
    for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
        neighbor_differs |= padded[:, dy : dy + HEIGHT, dx : dx + WIDTH] != ids
    assert changed.any() and not (changed & ~neighbor_differs).any()
    # the outline is blended: the antialiased coverage keeps the total area but has fractional pixels
    alpha = soft["alpha"][..., 0]
    assert ((alpha > 0.02) & (alpha < 0.98)).sum() > 40
    assert abs(alpha.sum() - hard["alpha"].sum()) < 0.03 * hard["alpha"].sum()
    # interior pixels far from any edge are untouched in every output
    for key in ("rgb", "depth", "normal"):
        torch.testing.assert_close(soft[key][~neighbor_differs], hard[key][~neighbor_differs])


def test_spot_antialiased_coverage_matches_supersampling(spot, cameras):
    """Antialiased alpha vs the hard coverage of an 8x supersampled render, box-filtered down."""
    soft = find("mesh-rasterizer")()(spot, cameras)["alpha"][..., 0]
    hard_renderer = find("mesh-rasterizer")({"antialias": False})
    hard = hard_renderer(spot, cameras)["alpha"][..., 0]
    factor = 8
    fine = hard_renderer(spot, cameras.resized(WIDTH * factor, HEIGHT * factor))["alpha"][..., 0]
    coverage = fine.view(2, HEIGHT, factor, WIDTH, factor).mean((2, 4))
    err_soft, err_hard = (soft - coverage).abs().sum(), (hard - coverage).abs().sum()
    assert err_soft < 0.35 * err_hard, (err_soft, err_hard)


def test_uv_texture_can_be_optimized_through_the_renderer(spot, cameras):
    """Custom-mesh texturing in miniature: recover a texture image from renders of the textured mesh."""
    renderer = find("mesh-rasterizer")({"background_color": [0.0, 0.0, 0.0], "antialias": False})
    small = torch.nn.functional.interpolate(spot.texture.permute(2, 0, 1)[None], size=(32, 32), mode="area")[0].permute(1, 2, 0)
    with torch.no_grad():
        target = renderer(Mesh(spot.vertices, spot.faces, uv=spot.uv, uv_faces=spot.uv_faces, texture=small), cameras)["rgb"]
    texture = torch.full((32, 32, 3), 0.5, requires_grad=True)
    optimizer = torch.optim.Adam([texture], lr=0.05)
    losses = []
    for _ in range(30):
        out = renderer(spot, cameras, color_fn=lambda s: sample_texture(texture, s["uv"]))
        loss = ((out["rgb"] - target) ** 2).mean()
        losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert losses[-1] < 0.2 * losses[0], losses
