"""The faster meshing steps (work on the level's index box, lexsort welding, bincount normals) give exactly what the
whole-grid versions they replaced give."""

import mcubes
import numpy as np
import pytest
from scipy import ndimage

from lift3d.export.grid import grid_axes, level_crop
from lift3d.export.mesh import (
    fill_cavities,
    keep_largest_regions,
    marching_cubes,
    remove_degenerate,
    submesh,
    unique_rows,
)


def _blobs(seed: int, shape=(20, 17, 23), touch_border: bool = False) -> np.ndarray:
    """A smooth random field whose solid part (above 0) is a few blobs, some with holes, inside the grid or touching it."""
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.normal(size=shape), 1.5).astype(np.float32)
    mask = np.zeros(shape, bool)
    mask[3:-3, 4:-3, 3:-4] = True
    if touch_border:
        mask[0:6] = True
    return np.where(mask, field * 10 + 0.05, -1.0).astype(np.float32)


def _reference_marching_cubes(volume, threshold, axes, close_boundary=True):
    """The whole-grid marching cubes the cropped one replaced."""
    pad = 1 if close_boundary else 0
    if pad:
        volume = np.pad(volume, 1, mode="constant", constant_values=min(float(volume.min()), threshold) - 1.0)
    vertices, faces = mcubes.marching_cubes(volume, float(threshold))
    origin, step = np.array([a[0] for a in axes]), np.array([a[1] - a[0] for a in axes])
    world = origin + (vertices - pad) * step
    if pad:
        world = np.clip(world, origin, np.array([a[-1] for a in axes]))
    return world.astype(np.float32), faces


def test_level_crop_holds_every_sample_at_the_level():
    volume = _blobs(0)
    crop = level_crop(volume, 0.0)
    outside = np.ones(volume.shape, bool)
    outside[crop] = False
    assert (volume[outside] < 0.0).all() and (volume[crop] >= 0.0).any()
    assert all(s.start > 0 for s in crop)  # the blobs keep off the border, so the box (one sample larger) does too
    assert level_crop(volume, 100.0) is None


@pytest.mark.parametrize("touch_border", [False, True])
@pytest.mark.parametrize("close_boundary", [True, False])
def test_cropped_marching_cubes_equals_the_whole_grid(touch_border, close_boundary):
    volume = _blobs(1, touch_border=touch_border)
    axes = grid_axes([[-1.0, -0.8, -1.1], [1.0, 0.8, 1.1]], 23)
    mesh = marching_cubes(volume, 0.0, axes, close_boundary=close_boundary)
    vertices, faces = _reference_marching_cubes(volume, 0.0, axes, close_boundary)
    assert len(faces) > 100
    assert np.array_equal(mesh.faces, faces) and np.allclose(mesh.vertices, vertices, rtol=0, atol=1e-6)
    assert len(marching_cubes(volume, 100.0, axes).faces) == 0


@pytest.mark.parametrize("touch_border", [False, True])
def test_fill_cavities_equals_binary_fill_holes(touch_border):
    volume = _blobs(2, touch_border=touch_border)
    volume[8:12, 8:12, 8:12] = 5.0
    volume[9:11, 9:11, 9:11] = -1.0  # a pocket for certain
    filled = fill_cavities(volume, 0.0)
    solid = volume > 0.0
    pockets = ndimage.binary_fill_holes(solid) & ~solid
    assert pockets.any()
    assert (filled[pockets] > 0.0).all() and np.array_equal(filled[~pockets], volume[~pockets])
    empty = np.full((6, 6, 6), -1.0, np.float32)
    assert fill_cavities(empty, 0.0) is empty


def test_keep_largest_regions_equals_labelling_the_whole_grid():
    volume = _blobs(3)
    kept = keep_largest_regions(volume, 1.0, count=2)
    labels, n = ndimage.label(volume > 1.0, structure=np.ones((3, 3, 3), bool))
    assert n > 2
    sizes = np.bincount(labels.ravel())[1:]
    keep = np.argsort(-sizes, kind="stable")[:2] + 1
    drop = (labels > 0) & ~np.isin(labels, keep)
    expected = volume.copy()
    expected[drop] = min(float(volume.min()), 1.0)
    assert np.array_equal(kept, expected)


def test_unique_rows_equals_numpy_unique():
    keys = np.random.default_rng(4).integers(-3, 3, size=(500, 3))
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    got_first, got_inverse = unique_rows(keys)
    assert np.array_equal(got_first, first) and np.array_equal(got_inverse, inverse.reshape(-1))


def test_welding_normals_and_submesh_on_a_marching_cubes_mesh():
    volume = _blobs(5)
    volume[volume.shape[0] // 2] = np.where(volume[volume.shape[0] // 2] > 0, 0.0, volume[volume.shape[0] // 2])
    axes = grid_axes([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]], 23)
    mesh = marching_cubes(volume, 0.0, axes)
    welded = remove_degenerate(mesh, 1e-6)
    assert len(welded.vertices) < len(mesh.vertices)  # the samples at exactly the level give coincident vertices
    normals = np.zeros((len(welded.vertices), 3))
    tri = welded.vertices[welded.faces].astype(np.float64)
    for corner in range(3):
        np.add.at(normals, welded.faces[:, corner], np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]))
    length = np.linalg.norm(normals, axis=1, keepdims=True)
    normals = np.where(length > 0, normals / np.maximum(length, 1e-20), [0.0, 0.0, 1.0])
    assert np.allclose(welded.vertex_normals(), normals, atol=1e-6)
    half = submesh(welded, np.arange(len(welded.faces)) % 2 == 0)
    assert np.array_equal(half.vertices, welded.vertices[np.unique(welded.faces[::2])])  # vertices kept in their order
    assert np.allclose(half.vertices[half.faces], welded.vertices[welded.faces[::2]])
