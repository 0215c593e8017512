"""The surface_meshes benchmark's measures (point-to-surface distances, Chamfer as % of the diagonal, normal
consistency) and its per-method overrides."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh

from benchmarks.suite.surface_meshes import (
    Truth,
    closest_points_on_triangles,
    compare,
    method_overrides,
    observed,
    sphere_views,
)
from lift3d.cameras import Cameras, intrinsics_matrix, look_at


def _cube(side: float = 1.0, offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    v = np.array([[x, y, z] for x in (0, 1) for y in (0, 1) for z in (0, 1)], np.float64) * side + offset
    f = np.array([[0, 1, 3], [0, 3, 2], [4, 6, 7], [4, 7, 5], [0, 4, 5], [0, 5, 1],
                  [2, 3, 7], [2, 7, 6], [0, 2, 6], [0, 6, 4], [1, 5, 7], [1, 7, 3]])
    return v, f


def test_closest_points_on_triangles_match_a_dense_search():
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(size=(300, 3)) for _ in range(3))
    c[:20] = a[:20] + 2 * (b[:20] - a[:20])  # degenerate: on one line
    p = rng.normal(size=(300, 3)) * 2
    closest = closest_points_on_triangles(p, a, b, c)
    u, v = np.meshgrid(np.linspace(0, 1, 201), np.linspace(0, 1, 201))
    keep = u + v <= 1
    u, v = u[keep], v[keep]  # barycentric grid over each triangle
    grid = a[:, None] + u[None, :, None] * (b - a)[:, None] + v[None, :, None] * (c - a)[:, None]
    brute = np.linalg.norm(grid - p[:, None], axis=-1).min(1)
    ours = np.linalg.norm(closest - p, axis=-1)
    assert (ours <= brute + 1e-9).all()  # never farther than any point of the triangle
    assert np.abs(ours - brute).max() < 0.03  # and as near as the grid's spacing allows


def test_a_mesh_scores_zero_against_itself_and_its_offset_against_a_grown_copy():
    v, f = _cube()
    same = compare(v, f, Truth.of(v, f, 20000))
    assert same["chamfer_pct"] < 1e-6 and same["normal_consistency"] > 0.999  # no floor from the samples' spacing
    grown, _ = _cube(side=1.1, offset=-0.05)  # every face 0.05 out: 0.05 / sqrt(3) = 2.887 % of the true diagonal
    apart = compare(grown, f, Truth.of(v, f, 20000))
    assert apart["completeness_pct"] == pytest.approx(100 * 0.05 / 3**0.5, abs=1e-3)  # each face's points straight out
    assert 2.887 < apart["accuracy_pct"] < 3.5  # the grown cube's corners are farther (up to 0.05 sqrt(3))
    assert apart["normal_consistency"] > 0.95  # past the true edges, the nearest true face may be either neighbour


def _ball(center, radius: float) -> tuple[np.ndarray, np.ndarray]:
    ball = trimesh.creation.icosphere(subdivisions=3, radius=radius)
    return np.asarray(ball.vertices) + np.asarray(center, np.float64), np.asarray(ball.faces)


def _join(*parts: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.cumsum([0] + [len(v) for v, _ in parts[:-1]])
    return np.concatenate([v for v, _ in parts]), np.concatenate([f + o for (_, f), o in zip(parts, offsets)])


def test_observed_points_are_those_in_front_of_what_the_camera_renders():
    # one camera above, looking down; a roof over the +x +y quadrant hides the ball under it, the other ball is open
    # to the sky: a flipped image axis would move the hidden ball's points onto open sky
    roof = (np.array([[0.1, 0.1, 0.6], [1.0, 0.1, 0.6], [1.0, 1.0, 0.6], [0.1, 1.0, 0.6]]), np.array([[0, 1, 2], [0, 2, 3]]))
    v, f = _join(roof, _ball([0.5, 0.5, 0.0], 0.2), _ball([-0.5, -0.5, 0.0], 0.2))
    camera = Cameras(look_at(torch.tensor([[0.0, 0.0, 3.0]]), torch.zeros(1, 3), torch.tensor([[0.0, 1.0, 0.0]])),
                     intrinsics_matrix(*(torch.tensor([60.0]),) * 2, *(torch.tensor([40.0]),) * 2), 80, 80)
    tops = [np.array([x, y, 0.0]) + 0.2 * np.array([np.cos(a) * np.sin(b), np.sin(a) * np.sin(b), np.cos(b)])
            for x, y in ((0.5, 0.5), (-0.5, -0.5)) for a in np.linspace(0, 6, 12) for b in (0.0, 0.3, 0.6)]
    seen = observed(np.array(tops), v, f, camera, tolerance=0.01)
    assert not seen[:36].any() and seen[36:].all()


def test_completeness_counts_only_the_true_surface_the_views_see():
    # the truth holds a box inside a box: no view sees the inner one, so a mesh without it is complete
    outer, inner = _cube(offset=-0.5), _cube(side=0.3, offset=-0.3)  # centered on the views' target
    truth_v, truth_f = _join(outer, inner)
    truth = Truth.of(truth_v, truth_f, 20000, sphere_views(20, 64))
    assert 100 * (1 - truth.seen.mean()) == pytest.approx(100 * 0.09 / 1.09, abs=0.5)  # the inner box's share of area
    score = compare(*outer, truth)
    assert score["completeness_pct"] < 1e-6 and score["completeness_all_pct"] > 0.5  # 0.2 to 0.35 away
    assert score["observed_pct"] == pytest.approx(100 * truth.seen.mean(), abs=0.01)
    whole = compare(*outer, Truth.of(truth_v, truth_f, 20000))
    assert whole["completeness_pct"] == pytest.approx(score["completeness_all_pct"], rel=1e-6)
    assert "observed_pct" not in whole


def test_method_overrides_apply_to_their_method_only():
    given = ["trainer.max_steps=7000", "surfels:system.normal_start=3000", "data.root=C:/scene"]
    assert method_overrides(given, "surfels") == ["trainer.max_steps=7000", "system.normal_start=3000", "data.root=C:/scene"]
    assert method_overrides(given, "nerf") == ["trainer.max_steps=7000", "data.root=C:/scene"]
    with pytest.raises(SystemExit, match="names no method"):
        method_overrides(["surfel:system.normal_start=3000"], "surfels")
