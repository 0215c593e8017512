"""TSDF fusion of rendered depths on an analytic scene: a sphere ray-cast from known views fuses into a mesh on the
sphere (bounded and contracted grids), unseen space leaves an opening rather than a wall, enclosed unseen space is
solid with fill_holes, and a Gaussian run's export takes the tsdf mesh method."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.config import ConfigError
from lift3d.export.config import ExportConfig
from lift3d.export.tsdf import (
    TSDFConfig,
    bounded_grid,
    contracted_grid,
    fuse_depths,
    fuse_narrow_band,
    solid_and_masked,
    tsdf_mesh,
)
from lift3d.export.tsdf_sources import sphere_cameras, tsdf_mesh_from_renders

RADIUS = 0.5
CENTER = torch.tensor([0.1, -0.05, 0.2])


def sphere_render(cameras: Cameras) -> dict[str, torch.Tensor]:
    """The sphere ray-cast exactly: z-depth and coverage of every pixel center (what a renderer returns)."""
    origins, directions = cameras.rays(normalized=False)  # camera-space z of the directions is -1: t is the z-depth
    oc = origins - CENTER
    a, b, c = (directions * directions).sum(-1), (oc * directions).sum(-1), (oc * oc).sum(-1) - RADIUS**2
    disc = b * b - a * c
    t = (-b - disc.clamp_min(0).sqrt()) / a
    hit = (disc > 0) & (t > 0)
    depth = torch.where(hit, t, torch.zeros_like(t))[..., None]
    rgb = torch.where(hit[..., None], torch.tensor([0.8, 0.3, 0.2]), torch.ones(3))
    return {"rgb": rgb, "depth": depth, "alpha": hit[..., None].float()}


def _frames(cameras: Cameras, batch: int = 8):
    for start in range(0, len(cameras), batch):
        view = cameras[start : start + batch]
        out = sphere_render(view)
        yield view, out["depth"][..., 0], out["alpha"][..., 0]


def _distance_to_sphere(vertices: np.ndarray) -> np.ndarray:
    return np.abs(np.linalg.norm(vertices - CENTER.numpy(), axis=1) - RADIUS)


def _boundary_edges(faces: np.ndarray) -> int:
    edges = np.sort(np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]]), axis=1)
    _, counts = np.unique(edges, axis=0, return_counts=True)
    return int((counts == 1).sum())


@pytest.fixture(scope="module")
def around():
    """30 views of 80 x 80 pixels all around the sphere."""
    points = CENTER + RADIUS * torch.tensor([[1.0, 1, 1], [-1, -1, -1]])
    return sphere_cameras(points, 30, 80)


def test_a_sphere_seen_from_around_fuses_onto_the_sphere(around):
    box = np.array([[-0.6, -0.7, -0.5], [0.8, 0.6, 0.9]])
    grid = bounded_grid(box, 40)
    voxel = float(grid.step.max())
    volume = fuse_depths(grid, _frames(around), truncation=4.0)
    mesh = tsdf_mesh(volume)
    distance = _distance_to_sphere(mesh.vertices)
    assert len(mesh.faces) > 1500
    # projective distances, truncated in front and dropped far behind, put the level a tenth of a voxel inside on average
    assert distance.max() < 0.45 * voxel and distance.mean() < 0.15 * voxel, (distance.max() / voxel, distance.mean() / voxel)
    assert _boundary_edges(mesh.faces) == 0  # closed
    outward = ((mesh.with_normals().normals * (mesh.vertices - CENTER.numpy())).sum(-1) > 0).mean()
    assert outward > 0.99
    # the inside, deeper than the truncation, is seen by no view: solid with fill_holes, left out without
    values, masked = solid_and_masked(volume, fill_holes=True)
    middle = tuple(int(np.argmin(np.abs(a - c))) for a, c in zip(grid.axes, CENTER.tolist()))
    assert volume.weight[middle] == 0 and values[middle] == 1.0 and not masked[middle]
    assert solid_and_masked(volume, fill_holes=False)[1][middle]
    open_mesh = tsdf_mesh(volume, fill_holes=False)
    assert abs(len(open_mesh.faces) - len(mesh.faces)) < 0.01 * len(mesh.faces)  # no inner wall either way


def test_fusing_near_surfaces_only_gives_the_whole_grid_s_mesh(around):
    grid = bounded_grid(np.array([[-0.6, -0.7, -0.5], [0.8, 0.6, 0.9]]), 68)
    frames = list(_frames(around))
    whole, band = fuse_depths(grid, frames), fuse_narrow_band(grid, frames, coarse=4)
    assert torch.equal(band.weight > 0, whole.weight > 0)  # the same voxels observed, the same left unknown
    a, b = tsdf_mesh(whole), tsdf_mesh(band)
    assert len(a.faces) == len(b.faces)
    np.testing.assert_allclose(np.sort(a.vertices, axis=0), np.sort(b.vertices, axis=0), atol=1e-6)


def test_the_contracted_grid_fuses_the_sphere_in_its_inner_box(around):
    box = np.array([[-0.6, -0.7, -0.5], [0.8, 0.6, 0.9]])
    grid = contracted_grid(box, 72)
    world_voxel = float(grid.step.max() * np.max(grid.half))
    mesh = tsdf_mesh(fuse_depths(grid, _frames(around), truncation=4.0))
    distance = _distance_to_sphere(mesh.vertices)
    assert len(mesh.faces) > 500 and distance.max() < 0.5 * world_voxel, distance.max() / world_voxel
    # grid space and world space round-trip
    points = torch.tensor([[0.3, -0.2, 0.1], [1.5, 0.2, -0.4]], dtype=torch.float64)
    from lift3d.fields.contraction import contract

    back = contract((grid.to_world(points) - torch.as_tensor(grid.center)) / torch.as_tensor(grid.half), "sphere")
    torch.testing.assert_close(back, points)


def test_space_no_view_sees_is_left_open_or_closed_with_fill_holes():
    points = CENTER + RADIUS * torch.tensor([[1.0, 1, 1], [-1, -1, -1]])
    above = sphere_cameras(points, 36, 96)
    above = above[(above.positions[:, 2] > CENTER[2] + 0.5).nonzero()[:, 0]]  # views from above only
    grid = bounded_grid(np.array([[-0.6, -0.7, -0.5], [0.8, 0.6, 0.9]]), 48)
    volume = fuse_depths(grid, _frames(above), truncation=4.0)
    opened = tsdf_mesh(volume, fill_holes=False)
    assert _distance_to_sphere(opened.vertices).max() < 0.45 * float(grid.step.max())  # every face on the sphere
    assert _boundary_edges(opened.faces) > 20  # open below, where no view looks
    assert opened.vertices[:, 2].min() > CENTER[2].item() - 0.9 * RADIUS
    closed = tsdf_mesh(volume, fill_holes=True)  # the unseen region under the sphere becomes solid: a shell closes it
    assert len(closed.faces) > 1.2 * len(opened.faces)
    off = _distance_to_sphere(closed.vertices) > 0.45 * float(grid.step.max())
    assert off.any() and (closed.vertices[off, 2] < CENTER[2].item()).all()  # the closing is below, unseen


def test_a_mesh_from_renders_is_cleaned_decimated_and_colored(around):
    cfg = ExportConfig(resolution=40, target_faces=1500, keep_components=1)
    box = np.array([[-0.6, -0.7, -0.5], [0.8, 0.6, 0.9]])
    mesh = tsdf_mesh_from_renders(sphere_render, around, box, cfg, color_fn=lambda p: torch.full_like(p, 0.25))
    assert abs(len(mesh.faces) - 1500) < 150 and mesh.normals is not None
    np.testing.assert_allclose(mesh.vertex_colors, 0.25)
    assert _distance_to_sphere(mesh.vertices).max() < 0.02


def test_meshes_go_back_into_the_capture_s_frame():
    """A capture the data module normalized (scaled, turned, moved): the mesh is written in the capture's own frame, and
    the colors (baked at the mesh's points) are looked up where those points are in the run's world."""
    from lift3d.export.formats import ExportSources
    from lift3d.export.tsdf_sources import in_capture_frame
    from lift3d.meshes.mesh import Mesh

    angle = 0.7
    matrix = np.eye(4)
    matrix[:3, :3] = 2.5 * np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
    matrix[:3, 3] = [0.3, -1.0, 2.0]
    world = Mesh(np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]]), np.array([[0, 1, 2]])).with_normals()
    sources = in_capture_frame(ExportSources(mesh=lambda: world, color_fn=lambda p: p), matrix)
    mesh = sources.mesh()
    back = mesh.vertices.astype(np.float64) @ matrix[:3, :3].T + matrix[:3, 3]  # capture -> world by the similarity
    np.testing.assert_allclose(back, world.vertices, atol=1e-5)
    np.testing.assert_allclose(sources.color_fn(torch.as_tensor(mesh.vertices)).numpy(), world.vertices, atol=1e-5)
    np.testing.assert_allclose(mesh.normals @ matrix[:3, :3].T / 2.5, world.normals, atol=1e-5)
    assert in_capture_frame(sources, np.eye(4)) is sources


def test_tsdf_config_errors():
    from lift3d.config.schema import check_instance

    def check(**tsdf):
        check_instance(ExportConfig(tsdf=TSDFConfig(**tsdf)), "system.export", "a test")

    with pytest.raises(ConfigError, match="tsdf.depth must be one of median, expected"):
        check(depth="mean")
    with pytest.raises(ConfigError, match="tsdf.space must be one of bounded, contracted"):
        check(space="unbounded")
    with pytest.raises(ConfigError, match="tsdf.truncation"):
        check(truncation=0)
    with pytest.raises(ConfigError, match="mesh_method must be one of auto, density, tsdf"):
        check_instance(ExportConfig(mesh_method="poisson"), "system.export", "a test")
