"""Mesh files: .glb through the Khronos glTF validator, .obj/.mtl/.png and .ply reloaded by trimesh."""

import json
import struct

import numpy as np
import pytest
import torch
import trimesh
from PIL import Image
from plyfile import PlyData

from lift3d.export.mesh import extract_mesh
from lift3d.export.texture import bake_texture
from lift3d.export.writers import srgb_to_linear, write_glb, write_obj, write_ply
from tests.plugins.analytic_sphere import position_color, sphere_density
from tests.validators import gltf_problems, validate_gltf

TEXTURE = 128


@pytest.fixture(scope="module")
def colored():
    return extract_mesh(lambda p: sphere_density(p, 0.6), [[-1, -1, -1], [1, 1, 1]], 24, threshold=25.0,
                        color_fn=position_color)


@pytest.fixture(scope="module")
def textured(colored):
    return bake_texture(colored, position_color, texture_size=TEXTURE)


def _z_up(vertices: np.ndarray) -> np.ndarray:
    """Undo the writers' +y-up rotation (x, y, z) -> (x, z, -y)."""
    return np.stack([vertices[:, 0], -vertices[:, 2], vertices[:, 1]], 1)


def _single(loaded) -> trimesh.Trimesh:
    return loaded if isinstance(loaded, trimesh.Trimesh) else next(iter(loaded.geometry.values()))


def test_glb_files_pass_the_khronos_validator(tmp_path, textured, colored):
    paths = write_glb(textured, tmp_path / "textured.glb") + write_glb(colored, tmp_path / "colored.glb")
    reports = validate_gltf(*paths)
    for path, report in zip(paths, reports):
        assert report["issues"]["numErrors"] == 0, (path.name, gltf_problems(report))
        assert report["issues"]["numWarnings"] == 0, (path.name, gltf_problems(report))
    assert reports[0]["info"]["hasTextures"] and reports[0]["info"]["maxUVs"] == 1
    assert reports[0]["info"]["totalTriangleCount"] == len(textured.faces)
    assert not reports[1]["info"]["hasTextures"] and reports[1]["info"]["totalVertexCount"] == len(colored.vertices)


def test_glb_reloads_with_geometry_texture_and_linear_vertex_colors(tmp_path, textured, colored):
    tex = _single(trimesh.load(write_glb(textured, tmp_path / "t.glb")[0], process=False))
    assert np.allclose(_z_up(tex.vertices), textured.vertices, atol=1e-6)
    assert np.array_equal(np.asarray(tex.visual.material.baseColorTexture.convert("RGB")), textured.texture)
    assert np.allclose(tex.visual.uv, textured.uv, atol=1e-6)  # trimesh flips v back on import
    path = write_glb(colored, tmp_path / "c.glb")[0]
    colors = _glb_attribute(path, "COLOR_0")  # read straight from the file's JSON and binary chunks
    assert colors.dtype == np.uint8 and colors.shape == (len(colored.vertices), 4)
    expected = np.round(srgb_to_linear(colored.vertex_colors) * 255)
    assert np.abs(colors[:, :3].astype(float) - expected).max() <= 1
    assert np.allclose(_z_up(_glb_attribute(path, "NORMAL")), colored.normals, atol=1e-3)
    assert np.allclose(_z_up(_glb_attribute(path, "POSITION")), colored.vertices, atol=1e-6)


def _glb_attribute(path, name: str) -> np.ndarray:
    """The first primitive's vertex attribute ``name`` decoded from a .glb by hand (glTF 2.0 layout)."""
    data = path.read_bytes()
    magic, version, _ = struct.unpack_from("<4sII", data, 0)
    assert magic == b"glTF" and version == 2
    json_length, json_type = struct.unpack_from("<I4s", data, 12)
    assert json_type == b"JSON"
    gltf = json.loads(data[20 : 20 + json_length])
    bin_start = 20 + json_length + 8
    accessor = gltf["accessors"][gltf["meshes"][0]["primitives"][0]["attributes"][name]]
    view = gltf["bufferViews"][accessor["bufferView"]]
    dtype = {5121: np.uint8, 5126: np.float32}[accessor["componentType"]]
    width = {"VEC3": 3, "VEC4": 4}[accessor["type"]]
    offset = bin_start + view.get("byteOffset", 0) + accessor.get("byteOffset", 0)
    return np.frombuffer(data, dtype=dtype, count=accessor["count"] * width, offset=offset).reshape(-1, width)


def test_obj_mtl_png_reload_with_the_texture(tmp_path, textured):
    written = write_obj(textured, tmp_path / "asset.obj")
    assert sorted(p.name for p in written) == ["asset.mtl", "asset.obj", "asset.png"]
    assert "mtllib asset.mtl" in (tmp_path / "asset.obj").read_text()
    assert "map_Kd asset.png" in (tmp_path / "asset.mtl").read_text()
    loaded = _single(trimesh.load(tmp_path / "asset.obj", process=False))
    image = np.asarray(loaded.visual.material.image.convert("RGB"))
    assert np.array_equal(image, np.asarray(Image.open(tmp_path / "asset.png").convert("RGB")))
    assert image.shape == (TEXTURE, TEXTURE, 3)
    # the color read at each face center's uv is the field's color at its 3D center
    uv = loaded.visual.uv[loaded.faces].mean(1)
    centers = _z_up(loaded.vertices[loaded.faces].mean(1))
    x = np.clip((uv[:, 0] * TEXTURE).astype(int), 0, TEXTURE - 1)
    y = np.clip(((1 - uv[:, 1]) * TEXTURE).astype(int), 0, TEXTURE - 1)
    error = np.abs(image[y, x] / 255.0 - position_color(torch.from_numpy(centers)).numpy())
    assert np.percentile(error, 99) < 0.02
    assert len(loaded.faces) == len(textured.faces)


def test_untextured_obj_keeps_vertex_colors(tmp_path, colored):
    assert [p.name for p in write_obj(colored, tmp_path / "plain.obj", up_axis="z")] == ["plain.obj"]
    loaded = _single(trimesh.load(tmp_path / "plain.obj", process=False))
    assert np.allclose(loaded.vertices, colored.vertices, atol=1e-6)
    assert np.abs(loaded.visual.vertex_colors[:, :3] / 255.0 - colored.vertex_colors).max() <= 0.5 / 255 + 1e-6


def test_ply_holds_positions_normals_and_vertex_colors(tmp_path, colored):
    path = write_ply(colored, tmp_path / "mesh.ply")[0]
    vertex = PlyData.read(path)["vertex"]
    assert [p.name for p in vertex.properties] == ["x", "y", "z", "nx", "ny", "nz", "red", "green", "blue"]
    loaded = trimesh.load(path, process=False)
    assert np.allclose(_z_up(loaded.vertices), colored.vertices, atol=1e-6)
    assert np.array_equal(loaded.faces, colored.faces)
    assert np.array_equal(loaded.visual.vertex_colors[:, :3], np.round(colored.vertex_colors * 255).astype(np.uint8))


def test_up_axis_rotates_z_up_to_y_up(tmp_path, colored):
    y_up = PlyData.read(write_ply(colored, tmp_path / "y.ply")[0])["vertex"]
    z_up = PlyData.read(write_ply(colored, tmp_path / "z.ply", up_axis="z")[0])["vertex"]
    assert np.allclose(y_up["y"], z_up["z"]) and np.allclose(y_up["z"], -z_up["y"]) and np.allclose(y_up["x"], z_up["x"])
    with pytest.raises(ValueError, match="up_axis"):
        write_ply(colored, tmp_path / "bad.ply", up_axis="x")


def test_srgb_to_linear_follows_the_standard_curve():
    assert np.allclose(srgb_to_linear(np.array([0.0, 0.04045, 0.5, 1.0])), [0.0, 0.04045 / 12.92, 0.21404, 1.0], atol=1e-5)
