"""Gaussians started on a mesh (``system.gaussians.init=mesh``) take the mesh file's colors: a glTF's PBR base-color
texture and factor, an OBJ's map_Kd, vertex colors; a color that cannot be read is a warning naming the file."""

import logging

import numpy as np
import pytest
import trimesh
from PIL import Image

from lift3d.gaussians import init
from lift3d.gaussians.init import mesh_rotation, sample_mesh

QUADRANTS = np.array([[[230, 20, 20], [20, 200, 40]], [[30, 40, 220], [240, 220, 30]]], np.uint8)  # rows top, bottom


def _texture(size: int = 64) -> Image.Image:
    """Four flat quadrants (plus a little noise, as a photo texture has), top-left red."""
    rng = np.random.default_rng(0)
    image = np.repeat(np.repeat(QUADRANTS, size // 2, axis=0), size // 2, axis=1).astype(np.int16)
    image += rng.integers(-8, 9, image.shape, dtype=np.int16)
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def _quad(visual=None) -> trimesh.Trimesh:
    """A 2 x 1 rectangle in the file's xz-plane (y up), its UVs stretched over the whole texture (u along x, v along -z)."""
    vertices = np.array([[-1.0, 0.0, 0.5], [1.0, 0.0, 0.5], [1.0, 0.0, -0.5], [-1.0, 0.0, -0.5]])
    faces = np.array([[0, 1, 2], [0, 2, 3]])
    return trimesh.Trimesh(vertices, faces, visual=visual, process=False)


QUAD_UV = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])


def _expected(points: np.ndarray, texture: np.ndarray) -> np.ndarray:
    """The texel under each sampled point (points in lift3d's world, turned back into the file's frame)."""
    file_points = points @ mesh_rotation("+y")  # sample_mesh turns file points by R: world = file @ R.T
    u, v = (file_points[:, 0] + 1.0) / 2.0, 0.5 - file_points[:, 2]
    h, w = texture.shape[:2]
    rows = np.clip(((1.0 - v) * h).astype(int), 0, h - 1)
    cols = np.clip((u * w).astype(int), 0, w - 1)
    return texture[rows, cols] / 255.0


def test_gaussians_from_a_textured_glb_take_its_texture_colors(tmp_path):
    texture = _texture()
    material = trimesh.visual.material.PBRMaterial(baseColorTexture=texture)
    path = tmp_path / "textured.glb"
    _quad(trimesh.visual.TextureVisuals(uv=QUAD_UV, material=material)).export(path)
    points, colors = sample_mesh(path, 4000, seed=1)
    pixels = np.asarray(texture, np.float32) / 255.0
    assert np.abs(colors.numpy().mean(axis=0) - pixels.reshape(-1, 3).mean(axis=0)).max() < 0.05
    assert colors.numpy().std(axis=0).min() > 0.2  # not one flat color (the gray fallback)
    expected = _expected(points.numpy().astype(np.float64), np.asarray(texture))
    near = np.abs(colors.numpy() - expected).max(axis=1) < 0.1  # each point has its own texel's color
    assert near.mean() > 0.95


def test_base_color_factor_tints_the_texture_and_colors_untextured_materials(tmp_path):
    texture = _texture()
    tinted = trimesh.visual.material.PBRMaterial(baseColorTexture=texture, baseColorFactor=[0.5, 1.0, 1.0, 1.0])
    path = tmp_path / "tinted.glb"
    _quad(trimesh.visual.TextureVisuals(uv=QUAD_UV, material=tinted)).export(path)
    _, colors = sample_mesh(path, 3000)
    pixels = np.asarray(texture, np.float32).reshape(-1, 3).mean(axis=0) / 255.0
    assert np.allclose(colors.numpy().mean(axis=0), pixels * [0.5, 1.0, 1.0], atol=0.05)

    flat = trimesh.visual.material.PBRMaterial(baseColorFactor=[0.1, 0.6, 0.9, 1.0])
    path = tmp_path / "flat.glb"
    _quad(trimesh.visual.TextureVisuals(material=flat)).export(path)
    _, colors = sample_mesh(path, 200)
    assert np.allclose(colors.numpy(), [0.1, 0.6, 0.9], atol=0.01)


def test_obj_texture_and_vertex_colors(tmp_path):
    texture = _texture()
    path = tmp_path / "quad.obj"
    simple = trimesh.visual.material.SimpleMaterial(image=texture)
    _quad(trimesh.visual.TextureVisuals(uv=QUAD_UV, material=simple)).export(path)  # writes .mtl and the png
    _, colors = sample_mesh(path, 3000)
    assert np.abs(colors.numpy().mean(axis=0) - np.asarray(texture).reshape(-1, 3).mean(axis=0) / 255.0).max() < 0.05

    mesh = _quad()
    mesh.visual = trimesh.visual.ColorVisuals(mesh, vertex_colors=np.array([[255, 0, 0, 255]] * 2 + [[0, 0, 255, 255]] * 2))
    path = tmp_path / "vertex.ply"
    mesh.export(path)
    points, colors = sample_mesh(path, 2000)
    file_z = (points.numpy() @ mesh_rotation("+y"))[:, 2]  # red at z = +0.5, blue at z = -0.5, blended between
    assert np.allclose(colors.numpy()[:, 0], file_z + 0.5, atol=0.02)
    assert np.allclose(colors.numpy()[:, 2], 0.5 - file_z, atol=0.02)


def test_an_unreadable_color_is_a_warning_naming_the_file(tmp_path, monkeypatch, caplog):
    texture = _texture()
    path = tmp_path / "odd.glb"
    material = trimesh.visual.material.PBRMaterial(baseColorTexture=texture)
    _quad(trimesh.visual.TextureVisuals(uv=QUAD_UV, material=material)).export(path)

    def broken(material):
        raise OSError("truncated image data")

    monkeypatch.setattr(init, "material_base_color", broken)
    with caplog.at_level(logging.WARNING, logger="lift3d.gaussians.init"):
        _, colors = sample_mesh(path, 100)
    assert np.allclose(colors.numpy(), 0.5)
    assert any(str(path) in r.getMessage() and "truncated image data" in r.getMessage() for r in caplog.records
               if r.levelno == logging.WARNING)


def test_a_mesh_without_colors_is_gray_without_a_warning(tmp_path, caplog):
    path = tmp_path / "plain.stl"
    _quad().export(path)
    with caplog.at_level(logging.INFO, logger="lift3d.gaussians.init"):
        _, colors = sample_mesh(path, 50)
    assert np.allclose(colors.numpy(), 0.5)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("holds no colors" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("uvs", [np.array([[0.25, 0.75], [1.25, 0.75], [-0.75, -0.25]])])
def test_uvs_outside_the_unit_square_repeat(uvs):
    image = np.asarray(_texture(), np.float32) / 255.0
    assert np.allclose(init.sample_image(image, uvs), init.sample_image(image, np.mod(uvs, 1.0)))
