"""Mesh extraction from density fields: grid sampling, thresholds, marching cubes, clean-up, colors."""

import logging

import numpy as np
import pytest
import torch
import trimesh

from lift3d.export.grid import auto_threshold, grid_axes, otsu_level, sample_grid, tighten_bbox
from lift3d.export.mesh import decimate, extract_mesh, keep_largest_components, keep_largest_regions
from lift3d.meshes.mesh import Mesh
from tests.plugins.analytic_sphere import box_density, position_color, sphere_density

BOX = [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]


def _voxel(resolution: int) -> float:
    return 2.0 / (resolution - 1)


def test_grid_axes_keep_voxels_cubic():
    axes = grid_axes([[0, 0, 0], [2, 1, 0.5]], 9)
    assert [len(a) for a in axes] == [9, 5, 3]
    for a in axes:
        assert np.allclose(np.diff(a), 0.25)
    with pytest.raises(ValueError, match="max > min"):
        grid_axes([[0, 0, 0], [1, 0, 1]], 8)


def test_sample_grid_matches_direct_evaluation_in_compact_blocks():
    axes = grid_axes([[-1, -0.5, 0], [1, 0.5, 0.75]], 13)
    calls = []

    def fn(points):
        calls.append(points.clone())
        return torch.sin(3 * points[:, 0]) + points[:, 1] * points[:, 2] ** 2

    grid = sample_grid(fn, axes, chunk=30)
    x, y, z = np.meshgrid(*axes, indexing="ij")
    assert np.allclose(grid, np.sin(3 * x) + y * z**2, atol=1e-6)
    side = 3  # floor(30 ** (1/3)): cube blocks of at most 27 points
    steps = torch.tensor([a[1] - a[0] for a in axes], dtype=torch.float32)
    for points in calls:
        assert len(points) <= 30
        assert ((points.max(0).values - points.min(0).values) <= (side - 1) * steps + 1e-6).all()


def test_otsu_level_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    values = np.clip(np.concatenate([rng.normal(0.1, 0.05, 3000), rng.normal(0.8, 0.08, 700)]), 0, 1)
    cuts = np.linspace(0, 1, 257)[1:-1]

    def between(t):  # between-class variance of the samples split at t, computed directly
        low, high = values[values < t], values[values >= t]
        return len(low) * len(high) * (low.mean() - high.mean()) ** 2 / len(values) ** 2

    best = cuts[int(np.argmax([between(t) for t in cuts]))]
    assert otsu_level(values) == pytest.approx(best, abs=2 / 256)
    assert 0.25 < otsu_level(values) < 0.65


def test_auto_threshold_refuses_an_empty_field():
    with pytest.raises(ValueError, match="empty"):
        auto_threshold(np.zeros((4, 4, 4)), 0.1)


@pytest.mark.parametrize("resolution", [32, 48])
def test_sphere_vertices_lie_on_the_true_surface(resolution):
    radius = 0.6
    mesh = extract_mesh(lambda p: sphere_density(p, radius, width=0.05), BOX, resolution, threshold=25.0)
    error = np.abs(np.linalg.norm(mesh.vertices, axis=1) - radius)
    assert error.max() < 0.25 * _voxel(resolution)  # the level set peak/2 is exactly |x| = radius
    tm = trimesh.Trimesh(mesh.vertices, mesh.faces, process=False)
    assert tm.is_watertight and tm.volume > 0  # closed, wound outward
    assert tm.volume == pytest.approx(4 / 3 * np.pi * radius**3, rel=0.03)
    assert (np.sum(mesh.normals * mesh.vertices, axis=1) / radius > 0.9).all()  # outward unit normals


def test_automatic_threshold_lands_within_a_voxel_and_is_logged(caplog):
    radius, resolution = 0.55, 40
    with caplog.at_level(logging.INFO, logger="lift3d.export.mesh"):
        mesh = extract_mesh(lambda p: sphere_density(p, radius, width=0.005), BOX, resolution)
    assert "threshold chosen automatically" in caplog.text
    error = np.abs(np.linalg.norm(mesh.vertices, axis=1) - radius)
    assert error.max() < _voxel(resolution)


def test_box_vertices_lie_on_the_box_surface():
    half = torch.tensor([0.7, 0.5, 0.3])
    resolution = 41
    mesh = extract_mesh(lambda p: box_density(p, half, width=0.01), BOX, resolution, threshold=25.0)
    q = np.abs(mesh.vertices) - half.numpy()
    outside = np.linalg.norm(np.maximum(q, 0), axis=1)
    inside = np.minimum(q.max(axis=1), 0)
    distance = np.abs(outside + inside)  # exact distance to the box surface
    assert distance.max() < _voxel(resolution)
    assert np.allclose(mesh.vertices.max(0), half.numpy(), atol=_voxel(resolution))


def test_surfaces_cut_by_the_box_are_closed_on_its_faces():
    mesh = extract_mesh(lambda p: sphere_density(p, 0.6), [[-0.3, -1, -1], [1, 1, 1]], 24, threshold=25.0)
    assert mesh.vertices[:, 0].min() == pytest.approx(-0.3, abs=1e-6)
    assert trimesh.Trimesh(mesh.vertices, mesh.faces, process=False).is_watertight
    open_mesh = extract_mesh(lambda p: sphere_density(p, 0.6), [[-0.3, -1, -1], [1, 1, 1]], 24, threshold=25.0,
                             close_boundary=False)
    assert not trimesh.Trimesh(open_mesh.vertices, open_mesh.faces, process=False).is_watertight


def test_occupancy_tightens_the_box():
    occ = np.zeros((8, 8, 8), bool)
    occ[2:5, 3, 4:8] = True
    box = tighten_bbox(BOX, occ, pad_cells=1)
    assert np.allclose(box, [[-1 + 0.25, -1 + 0.5, -1 + 0.75], [-1 + 1.5, -1 + 1.25, 1.0]])  # cells 1..5, 2..4, 3..7
    assert np.allclose(tighten_bbox(BOX, np.zeros((4, 4, 4), bool)), BOX)
    sphere = extract_mesh(lambda p: sphere_density(p, 0.3), BOX, 64, threshold=25.0,
                          occupancy=torch.ones(1, 1, 1, dtype=torch.bool))
    tight = extract_mesh(lambda p: sphere_density(p, 0.3), BOX, 64, threshold=25.0, occupancy=_ball_occupancy(16, 0.3))
    # the same resolution over a smaller box: finer voxels, more faces, same surface
    assert len(tight.faces) > 1.5 * len(sphere.faces)
    assert np.abs(np.linalg.norm(tight.vertices, axis=1) - 0.3).max() < 0.01


def _ball_occupancy(n: int, radius: float) -> torch.Tensor:
    centers = (torch.arange(n) + 0.5) / n * 2 - 1
    grid = torch.stack(torch.meshgrid(centers, centers, centers, indexing="ij"), -1)
    return grid.norm(dim=-1) < radius + 2 / n


def test_keep_largest_components_drops_the_small_blob():
    def two_balls(p):
        return sphere_density(p - torch.tensor([0.4, 0, 0]), 0.4) + sphere_density(p + torch.tensor([0.6, 0, 0]), 0.2)

    both = extract_mesh(two_balls, BOX, 40, threshold=25.0)
    big = keep_largest_components(both, 1)
    assert len(big.faces) < len(both.faces)
    assert np.abs(np.linalg.norm(big.vertices - [0.4, 0, 0], axis=1) - 0.4).max() < 0.05
    assert keep_largest_components(both, 2).faces.shape == both.faces.shape


def test_decimation_reaches_the_target_and_keeps_the_shape():
    mesh = extract_mesh(lambda p: sphere_density(p, 0.6), BOX, 48, threshold=25.0)
    small = decimate(mesh, 1000)
    assert 900 <= len(small.faces) <= 1050
    assert np.abs(np.linalg.norm(small.vertices, axis=1) - 0.6).max() < 2 * _voxel(48)
    assert decimate(mesh, 0) is mesh


def test_a_whole_mesh_is_cut_to_the_export_budget_and_recolored():
    # a mesh stage hands its DMTet surface whole (129k faces at grid 128: 52 s of UV atlas on the CPU); the export's
    # target_faces applies to it as to a meshed field
    from lift3d.export.config import ExportConfig
    from lift3d.export.formats import ExportSources, export_formats
    from lift3d.export.mesh import decimated_to

    whole = trimesh.creation.icosphere(subdivisions=5, radius=0.6)  # 20,480 faces
    mesh = Mesh(whole.vertices.astype(np.float32), whole.faces.astype(np.int64),
                np.full((len(whole.vertices), 3), 0.5, np.float32))
    small = decimated_to(mesh, 2000, position_color)
    assert 1800 <= len(small.faces) <= 2100 and small.normals is not None
    np.testing.assert_allclose(small.vertex_colors, position_color(torch.from_numpy(small.vertices)).numpy(), atol=1e-6)
    assert np.abs(np.linalg.norm(small.vertices, axis=1) - 0.6).max() < 0.01
    with_uvs = Mesh(mesh.vertices, mesh.faces, uv=np.zeros((len(mesh.vertices), 2), np.float32))
    assert decimated_to(with_uvs, 2000, position_color) is with_uvs  # a layout is kept whole
    assert decimated_to(mesh, 2000, None) is mesh and decimated_to(mesh, 0, position_color) is mesh

    class Saver:
        def __init__(self, root):
            self.root = root

        def path(self, name):
            return self.root / name

    import tempfile
    from pathlib import Path

    for to_budget, faces in ((True, (1800, 2100)), (False, (20480, 20480))):
        with tempfile.TemporaryDirectory() as folder:
            sources = ExportSources(mesh=lambda: mesh, color_fn=position_color, mesh_to_budget=to_budget)
            [path] = export_formats(Saver(Path(folder)), ["mesh-ply"], ExportConfig(target_faces=2000), sources)
            written = trimesh.load(path, force="mesh", process=False)
            assert faces[0] <= len(written.faces) <= faces[1]


def test_fill_holes_meshes_a_shell_as_one_outer_surface():
    def shell(p):
        return sphere_density(p, 0.6) - sphere_density(p, 0.4)

    both_walls = extract_mesh(shell, BOX, 40, threshold=25.0)
    outer = extract_mesh(shell, BOX, 40, threshold=25.0, fill_holes=True)
    r_both, r_outer = np.linalg.norm(both_walls.vertices, axis=1), np.linalg.norm(outer.vertices, axis=1)
    assert r_both.min() < 0.45 and r_both.max() > 0.55
    assert np.abs(r_outer - 0.6).max() < _voxel(40)


def test_vertex_colors_come_from_the_color_field():
    mesh = extract_mesh(lambda p: sphere_density(p, 0.5), BOX, 24, threshold=25.0, color_fn=position_color)
    assert np.allclose(mesh.vertex_colors, np.clip(0.5 + 0.5 * mesh.vertices, 0, 1), atol=1e-6)


def test_bad_inputs_say_what_is_wrong():
    with pytest.raises(ValueError, match="outside the density's range"):
        extract_mesh(lambda p: sphere_density(p, 0.5), BOX, 16, threshold=100.0)
    with pytest.raises(ValueError, match="must return"):
        extract_mesh(lambda p: torch.zeros(len(p), 2), BOX, 8, threshold=1.0)
    with pytest.raises(ValueError, match="non-finite"):
        extract_mesh(lambda p: torch.full((len(p),), float("nan")), BOX, 8, threshold=1.0)
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        extract_mesh(lambda p: p[:, 0], [0, 1], 8, threshold=0.5)
    with pytest.raises(ValueError, match="faces"):
        Mesh(np.zeros((3, 3)), np.array([[0, 1, 3]]))


def test_keep_largest_regions_lowers_the_smaller_solid_regions_only():
    volume = np.zeros((8, 8, 8), dtype=np.float32)
    volume[1:4, 1:4, 1:4] = 2.0  # 27 samples
    volume[6, 6, 6] = 3.0  # 1 sample, apart
    volume[4, 4, 4] = 1.5  # touches the big block only diagonally (26-connected): part of it
    kept = keep_largest_regions(volume, 1.0, count=1)
    assert kept[6, 6, 6] == 0.0 and kept[4, 4, 4] == 1.5
    assert np.array_equal(np.delete(kept.ravel(), 6 * 64 + 6 * 8 + 6), np.delete(volume.ravel(), 6 * 64 + 6 * 8 + 6))
    assert keep_largest_regions(volume, 1.0, count=2) is volume and keep_largest_regions(volume, 1.0, count=0) is volume
