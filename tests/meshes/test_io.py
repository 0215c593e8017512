"""Loading user meshes with trimesh: Spot's OBJ with its texture, a GLB round trip, axis conventions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from PIL import Image

from lift3d.meshes.io import axis_rotation, load_mesh


def test_spot_obj_loads_welded_normalized_and_textured(data_dir):
    folder = data_dir / "meshes" / "spot"
    mesh = load_mesh(folder / "spot.obj", texture_path=folder / "spot_texture.png")
    assert mesh.vertices.shape == (2930, 3) and mesh.faces.shape == (5856, 3)  # seams welded back
    assert mesh.uv.shape[0] > 2930 and mesh.uv_faces.shape == (5856, 3) and mesh.texture.shape == (1024, 1024, 3)
    assert (mesh.uv >= -0.1).all() and (mesh.uv <= 1.1).all()  # (the file has a few just outside 0..1)
    low, high = mesh.vertices.min(0).values, mesh.vertices.max(0).values
    torch.testing.assert_close((low + high) / 2, torch.zeros(3), atol=1e-6, rtol=0)
    assert abs((high - low).max().item() - 1.0) < 1e-6  # the unit box
    # the file is +y up; the world is +z up: the file's height (y extent) becomes the z extent
    raw = trimesh.load(folder / "spot.obj", process=False)
    extent = raw.bounds[1] - raw.bounds[0]
    scale = 1.0 / extent.max()
    np.testing.assert_allclose((high - low).numpy(), np.array([extent[2], extent[0], extent[1]]) * scale, rtol=1e-5)


def test_glb_round_trip_keeps_uvs_and_texture(data_dir, tmp_path):
    folder = data_dir / "meshes" / "spot"
    source = load_mesh(folder / "spot.obj", texture_path=folder / "spot_texture.png")
    raw = trimesh.load(folder / "spot.obj", process=False)
    image = Image.open(folder / "spot_texture.png").convert("RGB").resize((64, 64))
    # a PBR material with only the texture: trimesh turns a plain ``image=`` into a baseColorFactor of 0.4, which the
    # loader applies as glTF says (tests/meshes/test_mesh_files.py checks the factor)
    material = trimesh.visual.material.PBRMaterial(baseColorTexture=image)
    raw.visual = trimesh.visual.TextureVisuals(uv=raw.visual.uv, material=material)
    path = tmp_path / "spot.glb"
    raw.export(path)
    loaded = load_mesh(path)
    assert loaded.texture is not None and loaded.texture.shape == (64, 64, 3)
    np.testing.assert_allclose(loaded.texture.numpy(), np.asarray(image, np.float32) / 255.0, atol=1e-6)
    assert loaded.faces.shape == source.faces.shape
    # same surface points: compare each face's vertex positions and UVs
    torch.testing.assert_close(loaded.vertices[loaded.faces], source.vertices[source.faces], atol=1e-5, rtol=0)
    torch.testing.assert_close(loaded.uv[loaded.uv_faces], source.uv[source.uv_faces], atol=1e-6, rtol=0)


def test_axis_rotation_and_errors(tmp_path):
    rotation = axis_rotation("+y", "+z")
    np.testing.assert_allclose(rotation @ [0, 1, 0], [0, 0, 1])
    np.testing.assert_allclose(rotation @ [0, 0, 1], [1, 0, 0])
    assert np.isclose(np.linalg.det(rotation), 1.0)
    with pytest.raises(ValueError, match="perpendicular"):
        axis_rotation("+y", "-y")
    with pytest.raises(FileNotFoundError):
        load_mesh(tmp_path / "missing.obj")
    box = trimesh.creation.box()
    box.visual.vertex_colors = np.tile([255, 0, 0, 255], (len(box.vertices), 1))
    box.export(tmp_path / "box.ply")
    mesh = load_mesh(tmp_path / "box.ply", up_axis="+z", front_axis="+x")
    assert mesh.uv is None and mesh.vertex_colors is not None
    torch.testing.assert_close(mesh.vertex_colors, torch.tensor([1.0, 0.0, 0.0]).expand(8, 3))
