"""glTF with KHR_gaussian_splatting: the extension's attribute layout, round trips to float32 rounding, glTF's
left-up-front axes (the .ply's right-down-front turned half about z, as splat-transform turns it), the Khronos
validator, splat-transform's .glb read by our reader with the Gaussians of the .ply it came from, and clear errors."""

import json
import struct

import numpy as np
import pytest
import torch

from lift3d.export.writers import srgb_to_linear, write_glb
from lift3d.gaussians.formats.gltf import GltfSplatError, encode_gltf_splat, load_gltf_splat, save_gltf_splat
from lift3d.gaussians.formats.ply import load_ply, save_ply
from lift3d.meshes.mesh import Mesh
from lift3d.sh import Y0
from tests.gaussian_params import random_params, same_sign, unit
from tests.validators import gltf_problems, splat_transform, validate_gltf

EXT = "KHR_gaussian_splatting"
EPS = 1e-6  # float32 rounding: the file stores float32, and the axis change / activations are computed in float64


def chunks(data: bytes) -> tuple[dict, bytes]:
    """(JSON, BIN) of a .glb, parsed here independently of the reader."""
    json_length = struct.unpack_from("<I", data, 12)[0]
    document = json.loads(data[20: 20 + json_length])
    bin_length = struct.unpack_from("<I", data, 20 + json_length)[0]
    return document, data[28 + json_length: 28 + json_length + bin_length]


def glb(document: dict, blob: bytes) -> bytes:
    text = json.dumps(document).encode()
    text += b" " * (-len(text) % 4)
    return (struct.pack("<III", 0x46546C67, 2, 28 + len(text) + len(blob)) + struct.pack("<II", len(text), 0x4E4F534A)
            + text + struct.pack("<II", len(blob), 0x004E4942) + blob)


def attribute(document: dict, blob: bytes, semantic: str) -> np.ndarray:
    accessor = document["accessors"][document["meshes"][0]["primitives"][0]["attributes"][semantic]]
    view = document["bufferViews"][accessor["bufferView"]]
    dtype = {5126: "<f4", 5121: "u1"}[accessor["componentType"]]
    width = {"SCALAR": 1, "VEC3": 3, "VEC4": 4}[accessor["type"]]
    return np.frombuffer(blob, dtype=dtype, count=accessor["count"] * width, offset=view["byteOffset"]).reshape(-1, width)


@pytest.mark.parametrize("degree, up_axis", [(0, "y"), (1, "y"), (2, "z"), (3, "y")])
def test_round_trip_keeps_every_value_to_float32_rounding(tmp_path, degree, up_axis):
    params = random_params(80, degree=degree, seed=degree)
    back = load_gltf_splat(save_gltf_splat(tmp_path / "g.glb", params, up_axis=up_axis), up_axis=up_axis)
    assert back["shN"].shape == params["shN"].shape  # the SH degree is kept
    for name in ("means", "log_scales", "sh0", "shN"):
        assert torch.allclose(back[name], params[name], rtol=0, atol=EPS), name
    opacity = torch.sigmoid(params["opacity_logits"].double())
    # the logit of a float32 opacity: its rounding (2^-24) over the sigmoid's slope
    assert ((back["opacity_logits"] - params["opacity_logits"]).abs() <= 2.0**-24 / (opacity * (1 - opacity)) + EPS).all()
    assert torch.allclose(same_sign(unit(params["quats"]), back["quats"]), unit(params["quats"]), atol=EPS)


def test_attributes_follow_the_extension_and_glTF_axes(tmp_path):
    params = random_params(40, degree=2, seed=3)
    document, blob = chunks(save_gltf_splat(tmp_path / "g.glb", params).read_bytes())
    primitive = document["meshes"][0]["primitives"][0]
    assert primitive["mode"] == 0 and document["extensionsUsed"] == [EXT] and "extensionsRequired" not in document
    assert primitive["extensions"][EXT]["kernel"] == "ellipse"
    assert primitive["extensions"][EXT]["colorSpace"] == "srgb_rec709_display"
    expected = ["POSITION", "COLOR_0", f"{EXT}:ROTATION", f"{EXT}:SCALE", f"{EXT}:OPACITY", f"{EXT}:SH_DEGREE_0_COEF_0"]
    expected += [f"{EXT}:SH_DEGREE_{l}_COEF_{n}" for l in (1, 2) for n in range(2 * l + 1)]  # noqa: E741
    assert sorted(primitive["attributes"]) == sorted(expected)
    # glTF is left-up-front, the .ply frame right-down-front: lift3d's (x, y, z) is stored as (-x, -y, z)
    x, y, z = params["means"].double().unbind(1)
    position = torch.from_numpy(attribute(document, blob, "POSITION").astype(np.float64))
    assert torch.allclose(position, torch.stack([-x, -y, z], 1), atol=EPS)
    accessor = document["accessors"][primitive["attributes"]["POSITION"]]
    assert np.allclose(accessor["min"], position.min(0).values) and np.allclose(accessor["max"], position.max(0).values)
    scale = attribute(document, blob, f"{EXT}:SCALE")
    assert np.allclose(scale, params["log_scales"].exp().numpy(), rtol=1e-6)  # linear, not log
    opacity = attribute(document, blob, f"{EXT}:OPACITY")[:, 0]
    assert np.allclose(opacity, torch.sigmoid(params["opacity_logits"]).numpy(), atol=EPS)
    rotation = attribute(document, blob, f"{EXT}:ROTATION")
    assert np.allclose(np.linalg.norm(rotation, axis=1), 1, atol=EPS)  # unit quaternions, xyzw
    color = attribute(document, blob, "COLOR_0") / 255.0  # the fallback: linear color of the DC term, opacity
    rgb = srgb_to_linear(np.clip(0.5 + Y0 * params["sh0"][:, 0].numpy(), 0, 1))
    assert np.abs(color[:, :3] - rgb).max() <= 0.5 / 255 + EPS and np.abs(color[:, 3] - opacity).max() <= 0.5 / 255 + EPS


def test_the_khronos_validator_finds_nothing_but_the_extension_it_does_not_know(tmp_path):
    path = save_gltf_splat(tmp_path / "g.glb", random_params(30, degree=1))
    report = validate_gltf(path)[0]
    # gltf-validator 2.0.0-dev.3.10 (the newest on npm) predates KHR_gaussian_splatting: it says so (an info) and
    # calls the extension's "KHR_gaussian_splatting:*" attribute semantics invalid names; nothing else is reported
    infos = [m["code"] for m in report["issues"]["messages"] if m["severity"] == 2]
    assert "UNSUPPORTED_EXTENSION" in infos
    problems = gltf_problems(report)
    assert problems and all(code == "MESH_PRIMITIVE_INVALID_ATTRIBUTE" and f"/attributes/{EXT}:" in pointer
                            for code, pointer, _ in problems), problems
    assert len(problems) == 4 + 3  # ROTATION SCALE OPACITY SH_DEGREE_0_COEF_0 + three degree-1 coefficients
    # the same file with the extension's semantics renamed as application-specific ones ("_..."), which core glTF
    # allows: every accessor, buffer view, alignment and POSITION bound is then checked, and nothing is wrong
    document, blob = chunks(path.read_bytes())
    attributes = document["meshes"][0]["primitives"][0]["attributes"]
    document["meshes"][0]["primitives"][0]["attributes"] = {k.replace(f"{EXT}:", "_KHR_GS_"): v for k, v in attributes.items()}
    (tmp_path / "twin.glb").write_bytes(glb(document, blob))
    twin = validate_gltf(tmp_path / "twin.glb")[0]
    assert twin["issues"]["numErrors"] == 0 and twin["issues"]["numWarnings"] == 0, gltf_problems(twin)


def test_splat_transforms_glb_reads_back_with_the_gaussians_of_its_ply(tmp_path):
    params = random_params(100, degree=3, seed=11)
    save_ply(tmp_path / "g.ply", params)
    splat_transform(tmp_path / "g.ply", tmp_path / "theirs.glb")  # PlayCanvas's own KHR_gaussian_splatting writer
    back, source = load_gltf_splat(tmp_path / "theirs.glb"), load_ply(tmp_path / "g.ply")
    for name in ("means", "log_scales", "sh0", "shN", "opacity_logits"):
        assert torch.allclose(back[name], source[name], rtol=1e-5, atol=1e-5), name
    # (splat-transform stores the .ply's quaternions unnormalized, where the extension asks for unit ones)
    assert torch.allclose(same_sign(unit(source["quats"]), unit(back["quats"])), unit(source["quats"]), atol=1e-6)
    # both tools' .glb of one .ply hold the same numbers in every attribute of the extension
    ours = chunks(save_gltf_splat(tmp_path / "ours.glb", source).read_bytes())
    theirs = chunks((tmp_path / "theirs.glb").read_bytes())
    semantics = ours[0]["meshes"][0]["primitives"][0]["attributes"]
    assert sorted(semantics) == sorted(theirs[0]["meshes"][0]["primitives"][0]["attributes"])
    for semantic in semantics:
        a, b = attribute(*ours, semantic).astype(np.float64), attribute(*theirs, semantic).astype(np.float64)
        if semantic == f"{EXT}:ROTATION":
            a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
            b *= np.where((a * b).sum(1, keepdims=True) < 0, -1.0, 1.0)
        if semantic == "COLOR_0":  # the point-cloud fallback: ours linear (glTF colors are), theirs the sRGB values
            continue
        assert np.allclose(a, b, rtol=1e-5, atol=1e-5), semantic
    bounds = [doc["accessors"][doc["meshes"][0]["primitives"][0]["attributes"]["POSITION"]] for doc, _ in (ours, theirs)]
    assert all(np.allclose(bounds[0][key], bounds[1][key], atol=1e-5) for key in ("min", "max"))


def test_gaussians_of_a_y_down_ply_stand_up_in_gltf(tmp_path):
    """A column of Gaussians along the .ply's up (-y, right-down-front) stands along glTF's +y."""
    params = random_params(20, degree=0, seed=12)
    params["means"] = torch.stack([torch.zeros(20), -torch.linspace(0, 2, 20), torch.zeros(20)], dim=1)
    document, blob = chunks(save_gltf_splat(tmp_path / "g.glb", params).read_bytes())
    position = attribute(document, blob, "POSITION")
    assert np.allclose(position[:, 1], np.linspace(0, 2, 20), atol=EPS) and np.allclose(position[:, [0, 2]], 0, atol=EPS)


def _without(semantic: str):
    def edit(data: bytes) -> bytes:
        document, blob = chunks(data)
        del document["meshes"][0]["primitives"][0]["attributes"][semantic]
        return glb(document, blob)
    return edit


def _negative_scales(data: bytes) -> bytes:
    document, blob = chunks(data)
    accessor = document["accessors"][document["meshes"][0]["primitives"][0]["attributes"][f"{EXT}:SCALE"]]
    start = document["bufferViews"][accessor["bufferView"]]["byteOffset"]
    blob = blob[:start] + struct.pack("<f", -1.0) + blob[start + 4:]
    return glb(document, blob)


@pytest.mark.parametrize("damage, message", [
    (lambda data: b"glTF" + b"\0" * 4, "too short"),
    (lambda data: b"PK\x03\x04" + data[4:], "not a binary glTF 2.0"),
    (lambda data: data[:-10], "truncated or corrupt"),
    (_without(f"{EXT}:OPACITY"), "lacks the attribute KHR_gaussian_splatting:OPACITY"),
    (_negative_scales, "values <= 0"),
])
def test_bad_files_are_gltf_splat_errors(tmp_path, damage, message):
    path = tmp_path / "bad.glb"
    path.write_bytes(damage(encode_gltf_splat(random_params(10, degree=1))))
    with pytest.raises(GltfSplatError, match=message):
        load_gltf_splat(path)


def test_a_mesh_glb_is_not_taken_for_gaussians(tmp_path):
    vertices = torch.tensor([[0.0, 0, 0], [1, 0, 0], [0, 1, 0]])
    write_glb(Mesh(vertices, torch.tensor([[0, 1, 2]]), torch.full((3, 3), 0.5)), tmp_path / "mesh.glb")
    with pytest.raises(GltfSplatError, match="no mesh primitive with the KHR_gaussian_splatting extension"):
        load_gltf_splat(tmp_path / "mesh.glb")


def test_a_runs_gaussians_stand_up_in_gltf_where_its_mesh_does_and_read_back_exactly(tmp_path):
    """Gaussians in lift3d's world (+z up, a run's) are turned as the run's mesh .glb is, (x, y, z) -> (x, z, -y): a
    column along +z stands along glTF's +y, at the coordinates the mesh writer gives the same points. The asset's
    extras record the turn, so the reader undoes that one and returns the run's Gaussians, SH bands included."""
    params = random_params(40, degree=3, seed=21)
    params["means"][:20] = torch.stack([torch.zeros(20), torch.zeros(20), torch.linspace(0, 2, 20)], dim=1)
    data = save_gltf_splat(tmp_path / "run-gaussians.glb", params, up_axis="world").read_bytes()
    document, blob = chunks(data)
    assert document["asset"]["extras"] == {"lift3d": {"axes": "world"}}
    position = attribute(document, blob, "POSITION")
    assert np.allclose(position[:20, 1], np.linspace(0, 2, 20), atol=EPS) and np.allclose(position[:20, [0, 2]], 0, atol=EPS)
    vertices = params["means"].double().numpy()
    mesh = Mesh(vertices, np.array([[0, 1, 2]]), vertex_colors=np.full((40, 3), 0.5))
    mesh_document, mesh_blob = chunks(write_glb(mesh, tmp_path / "run.glb")[0].read_bytes())
    mesh_positions = attribute(mesh_document, mesh_blob, "POSITION")
    assert np.allclose(np.sort(mesh_positions, axis=0), np.sort(position, axis=0), atol=1e-5)  # the same points
    back = load_gltf_splat(tmp_path / "run-gaussians.glb")
    for name in ("means", "log_scales", "sh0", "shN"):
        assert torch.allclose(back[name], params[name], rtol=0, atol=1e-5), name
    assert torch.allclose(same_sign(unit(params["quats"]), back["quats"]), unit(params["quats"]), atol=1e-5)
    plain = chunks(save_gltf_splat(tmp_path / "file-gaussians.glb", params).read_bytes())[0]
    assert "extras" not in plain["asset"]  # a converted file's Gaussians: the .ply frame's half turn, read as before


def test_a_run_exports_upright_gltf_and_a_converted_file_keeps_splat_transforms_axes(tmp_path, capsys):
    """Through the export table: a system's Gaussians (lift3d's world) are written with the world turn and read back
    as they are; `lift3d export FILE.ply --format gltf-splat` converts with the .ply frame's turn (no extras)."""
    from lift3d.cli import main
    from lift3d.export import ExportConfig, GaussianTensors, export_formats, gaussian_sources, rgb_from_sh_dc
    from lift3d.saving import OutputSaver

    params = random_params(30, degree=1, seed=22)
    tensors = GaussianTensors(params["means"], params["log_scales"].exp(), params["quats"],
                              torch.sigmoid(params["opacity_logits"]), colors=rgb_from_sh_dc(params["sh0"][:, 0]))
    sources = gaussian_sources(tensors, ExportConfig(), gaussian_params=lambda: params)
    (written,) = export_formats(OutputSaver(tmp_path), ["gltf-splat"], ExportConfig(), sources, stem="run")
    assert chunks(written.read_bytes())[0]["asset"]["extras"] == {"lift3d": {"axes": "world"}}
    assert torch.allclose(load_gltf_splat(written)["means"], params["means"], atol=1e-5)
    save_ply(tmp_path / "model.ply", params)
    assert main(["export", str(tmp_path / "model.ply"), "--format", "gltf-splat"]) == 0, capsys.readouterr().err
    converted = tmp_path / "model-ply-gaussians.glb"
    document, blob = chunks(converted.read_bytes())
    assert "extras" not in document["asset"]
    turned = params["means"].double().numpy() * np.array([-1.0, -1.0, 1.0])  # the half turn about z
    assert np.allclose(attribute(document, blob, "POSITION"), turned, atol=1e-5)
