"""Meshes other tools write (glTF assembled by hand as Khronos' samples are, trimesh's glTF, Blender-style OBJ + MTL)
load with their colors and render through ``lift3d render FILE`` and the viewer's model loader: textures embedded or
beside the file, RGBA textures, baseColorFactor (alone and times a texture), vertex colors; a file that cannot be
read is one line."""

from __future__ import annotations

import json
import math

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.cli import main
from lift3d.meshes.io import load_mesh
from lift3d.meshes.mesh_files import srgb_to_linear
from lift3d.viewer.models import load_view_model
from tests.gltf_samples import (
    QUADRANTS,
    add_flat_box,
    box_document,
    png_bytes,
    quadrant_texture,
    write_glb,
    write_gltf,
    write_textured_obj,
)
from tests.validators import gltf_problems, validate_gltf

SIZE = 64
# pixels inside each quadrant of the box's front face, seen by FRONT_C2W (the face fills the middle of the frame)
PROBES = {"top_left": (24, 24), "top_right": (24, 40), "bottom_left": (40, 24), "bottom_right": (40, 40)}


def _front_c2w() -> torch.Tensor:
    """A camera on glTF's +z axis (lift3d's +x after the +y-up to +z-up turn), 8 units out, looking at the box."""
    return look_at(torch.tensor([[8.0, 0.0, 0.0]]), torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]))[0]


def _path_json(folder) -> str:
    record = {"version": 1, "fps": 1, "frames": 1, "width": SIZE, "height": SIZE,
              "keyframes": [{"c2w": _front_c2w().tolist(), "fovy_deg": 20.0}]}
    (folder / "front.json").write_text(json.dumps(record))
    return str(folder / "front.json")


def _rendered(path, folder, capsys=None) -> np.ndarray:
    """The one frame of ``lift3d render PATH --path front.json`` as float RGB [H, W, 3] in 0..1 (a .gif: lossless
    for these few colors)."""
    out = folder / f"{path.name}.gif"
    assert main(["render", str(path), "--path", _path_json(folder), "--out", str(out), "--device", "cpu"]) == 0
    frame = iio.imread(out)
    return (frame[0] if frame.ndim == 4 else frame)[..., :3].astype(np.float32) / 255.0


def _srgb(linear: np.ndarray) -> np.ndarray:
    linear = np.asarray(linear, np.float64)
    return np.where(linear <= 0.0031308, linear * 12.92, 1.055 * linear ** (1 / 2.4) - 0.055)


def _assert_quadrants(image: np.ndarray, scale: np.ndarray | float = 1.0, atol: float = 3 / 255) -> None:
    for name, (row, col) in PROBES.items():
        expected = np.asarray(QUADRANTS[name]) / 255.0 * scale
        np.testing.assert_allclose(image[row, col], expected, atol=atol, err_msg=name)


def _embedded_glb(folder):
    return write_glb(folder / "BoxTextured.glb", *box_document(png_bytes(quadrant_texture())))


def _external_gltf(folder):
    quadrant_texture().save(folder / "CesiumLogoFlat.png")
    return write_gltf(folder / "BoxTextured.gltf", *box_document("CesiumLogoFlat.png"), buffer_uri="BoxTextured0.bin")


def _data_uri_gltf(folder):
    quadrant_texture().save(folder / "texture.png")
    return write_gltf(folder / "embedded-buffer.gltf", *box_document("texture.png"))


def _rgba_glb(folder):
    return write_glb(folder / "rgba.glb", *box_document(png_bytes(quadrant_texture(alpha=128)), alpha_mode="BLEND"))


def _trimesh_glb(folder):
    """A textured glb as trimesh (and the many tools built on it) writes one: an RGBA PNG, its own buffer layout."""
    import trimesh
    from PIL import Image

    from tests.gltf_samples import box_arrays

    arrays = box_arrays()
    image = Image.fromarray(np.asarray(quadrant_texture(alpha=255)))
    uv = arrays["TEXCOORD_0"] * [1, -1] + [0, 1]  # trimesh's UVs have (0, 0) at the image's bottom left
    material = trimesh.visual.material.PBRMaterial(baseColorTexture=image)
    mesh = trimesh.Trimesh(arrays["POSITION"], arrays["indices"].reshape(-1, 3).astype(np.int64), process=False,
                           visual=trimesh.visual.TextureVisuals(uv=uv, material=material))
    mesh.export(folder / "trimesh.glb")
    return folder / "trimesh.glb"


def _obj(folder):
    return write_textured_obj(folder, quadrant_texture())


@pytest.mark.parametrize("make", [_embedded_glb, _external_gltf, _data_uri_gltf, _rgba_glb, _trimesh_glb, _obj],
                         ids=["embedded-png-glb", "gltf-external-image", "gltf-data-uri", "rgba-texture", "trimesh-glb",
                              "obj-mtl-png"])
def test_textured_meshes_render_their_texture(tmp_path, make):
    path = make(tmp_path)
    image = _rendered(path, tmp_path)
    _assert_quadrants(image)
    assert np.allclose(image[1, 1], 1.0)  # the white background around the box


def test_hand_made_samples_are_valid_gltf(tmp_path):
    """The samples are what the Khronos validator accepts, so the tests above read files as the world writes them."""
    paths = [_embedded_glb(tmp_path), _external_gltf(tmp_path), _rgba_glb(tmp_path),
             write_glb(tmp_path / "factor.glb", *box_document(base_color_factor=[0.2, 0.5, 0.9, 1.0]))]
    for report in validate_gltf(*paths):
        assert report["issues"]["numErrors"] == 0, gltf_problems(report)


def test_base_color_factor_alone_is_shown_in_srgb(tmp_path):
    factor = [0.2, 0.5, 0.9, 1.0]  # linear, as glTF defines it
    path = write_glb(tmp_path / "factor.glb", *box_document(base_color_factor=factor))
    image = _rendered(path, tmp_path)
    for row, col in PROBES.values():
        np.testing.assert_allclose(image[row, col], _srgb(factor[:3]), atol=3 / 255)


def test_base_color_factor_multiplies_the_texture_in_linear_light(tmp_path):
    factor = [0.5, 1.0, 0.25, 1.0]
    path = write_glb(tmp_path / "tinted.glb", *box_document(png_bytes(quadrant_texture()), base_color_factor=factor))
    image = _rendered(path, tmp_path)
    for name, (row, col) in PROBES.items():
        texel = np.asarray(QUADRANTS[name]) / 255.0
        linear = np.where(texel <= 0.04045, texel / 12.92, ((texel + 0.055) / 1.055) ** 2.4)
        np.testing.assert_allclose(image[row, col], _srgb(linear * factor[:3]), atol=3 / 255, err_msg=name)


def test_vertex_colors_stay_per_face_in_the_viewer(tmp_path):
    """COLOR_0 (linear, normalized uint8 RGBA) with one color per face of the box: corners that share a position but
    not a color are not welded together, so the front face is one flat color."""
    colors = np.zeros((24, 4), np.uint8)
    palette = [(200, 40, 20), (10, 180, 30), (20, 30, 220), (220, 220, 20), (20, 200, 200), (200, 20, 200)]
    for face, color in enumerate(palette):
        colors[4 * face:4 * face + 4] = (*color, 255)
    path = write_glb(tmp_path / "colors.glb", *box_document(vertex_colors=colors))
    model = load_view_model(path)
    cameras = Cameras(_front_c2w()[None], intrinsics_from_fovy(torch.tensor([math.radians(20.0)]), SIZE, SIZE), SIZE, SIZE)
    rgb = model.render_fn(cameras)["rgb"][0].numpy()
    assert rgb.shape[-1] == 3
    front = np.stack([rgb[r, c] for r, c in PROBES.values()])
    np.testing.assert_allclose(front, np.broadcast_to(_srgb(np.array(palette[0]) / 255.0), front.shape), atol=1e-3)


def test_an_rgba_texture_loads_as_rgb_with_welded_uv_faces(tmp_path):
    mesh = load_mesh(_rgba_glb(tmp_path))
    assert mesh.texture.shape == (64, 64, 3)
    assert len(mesh.vertices) == 8 and mesh.uv_faces is not None and len(mesh.uv) == 24  # a closed box with UV seams
    np.testing.assert_allclose(mesh.texture[0, 0].numpy(), np.asarray(QUADRANTS["top_left"]) / 255.0, atol=1e-6)


def test_a_missing_texture_image_is_one_warning_and_the_mesh_still_renders(tmp_path, capsys):
    path = _external_gltf(tmp_path)
    (tmp_path / "CesiumLogoFlat.png").unlink()
    image = _rendered(path, tmp_path)
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warned) == 1 and "CesiumLogoFlat.png is missing" in warned[0], warned
    np.testing.assert_allclose(image[32, 32], 0.8, atol=3 / 255)  # the renderer's default gray


def test_a_missing_buffer_is_one_line_naming_it(tmp_path, capsys):
    path = _external_gltf(tmp_path)
    (tmp_path / "BoxTextured0.bin").unlink()
    assert main(["render", str(path), "--path", _path_json(tmp_path), "--out", str(tmp_path / "o.gif")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BoxTextured0.bin" in err and "internal error" not in err, err


def test_a_truncated_glb_is_one_line(tmp_path, capsys):
    path = _embedded_glb(tmp_path)
    path.write_bytes(path.read_bytes()[:300])
    assert main(["view", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BoxTextured.glb" in err and "internal error" not in err, err


def test_a_textured_and_a_flat_part_with_node_transforms_render_together(tmp_path):
    """Two nodes: the textured box, and a flat-colored box moved and scaled by its node; both show with their colors."""
    document, binary = box_document(png_bytes(quadrant_texture()))
    factor = [0.1, 0.6, 0.3, 1.0]
    path = write_glb(tmp_path / "truck.glb", add_flat_box(document, [3.0, 0.0, 0.0], 0.5, factor), binary)
    width, height = 128, 64
    c2w = look_at(torch.tensor([[16.0, 0.0, 0.0]]), torch.zeros(1, 3), torch.tensor([[0.0, 0.0, 1.0]]))
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.tensor([math.radians(20.0)]), width, height), width, height)
    rgb = load_view_model(path).render_fn(cameras)["rgb"][0].numpy()
    for name, (row, col) in {"top_left": (26, 58), "top_right": (26, 70), "bottom_left": (38, 58),
                             "bottom_right": (38, 70)}.items():
        np.testing.assert_allclose(rgb[row, col], np.asarray(QUADRANTS[name]) / 255.0, atol=3 / 255, err_msg=name)
    np.testing.assert_allclose(rgb[32, 99], _srgb(factor[:3]), atol=3 / 255)  # glTF x = 3 is the image's right
    assert np.allclose(rgb[32, 84], 1.0) and np.allclose(rgb[32, 110], 1.0)  # the flat box is half as wide


def test_lift3d_vertex_color_glb_reads_back_its_colors(tmp_path):
    """lift3d's own .glb stores vertex colors as linear COLOR_0 beside a material; they read back as written."""
    from lift3d.export.mesh import Mesh as ExportMesh
    from lift3d.export.writers import write_glb as lift3d_write_glb
    from tests.gltf_samples import box_arrays

    arrays = box_arrays()
    colors = np.random.default_rng(0).uniform(0.05, 0.95, (24, 3)).astype(np.float32)
    lift3d_write_glb(ExportMesh(arrays["POSITION"], arrays["indices"].reshape(-1, 3).astype(np.int64), colors),
                     tmp_path / "colors.glb", up_axis="z")
    mesh = load_mesh(tmp_path / "colors.glb", normalize=False, weld=False, up_axis="+z", front_axis="+x")
    # stored as 8-bit linear values: equal to rounding there
    np.testing.assert_allclose(srgb_to_linear(mesh.vertex_colors.numpy()), srgb_to_linear(colors), atol=0.6 / 255)


def test_ply_face_colors_stay_per_face(tmp_path):
    """A PLY with one color per face (as trimesh and MeshLab write them) keeps each face's color at its corners."""
    import trimesh

    box = trimesh.creation.box(extents=(2, 2, 2))
    face_colors = np.zeros((len(box.faces), 4), np.uint8)
    face_colors[:, 3] = 255
    face_colors[:, 0] = np.arange(len(box.faces)) * 20
    box.visual = trimesh.visual.ColorVisuals(box, face_colors=face_colors)
    box.export(tmp_path / "faces.ply")
    mesh = load_mesh(tmp_path / "faces.ply", normalize=False, weld=False)
    corners = mesh.vertex_colors[mesh.faces].numpy()  # [F, 3 corners, 3]
    np.testing.assert_allclose(corners[..., 0], np.repeat(face_colors[:, :1] / 255.0, 3, axis=1), atol=1e-6)
