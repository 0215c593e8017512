"""Mesh stages (lift3d.systems.mesh_stages): a refine stage started from a NeRF stage's checkpoint with
the tiny random Stable Diffusion, its textured .glb checked by the Khronos validator, and resuming."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from lift3d.checkpoints import load_checkpoint
from lift3d.cli import main
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.runs.runner import run_experiment
from lift3d.systems.stages import load_previous_stage
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)
from tests.validators import gltf_problems, validate_gltf

THRESHOLD = 5.0  # the NeRF stage's export threshold: the refine stage must mesh its density at this level

COMMON = [
    "use_timestamp=false",
    "trainer.precision=32-true",
    "trainer.enable_progress_bar=false",
    "trainer.val_check_interval=0",
    "checkpoint.every_n_train_steps=0",
    "data.height=32",
    "data.width=32",
    "data.eval_height=32",
    "data.eval_width=32",
    "data.n_val_views=1",
    "data.n_test_views=2",
    "system.guidance.resolution=64",
    "system.guidance.prompt=a cow",
]


def glb_json(path) -> dict:
    """The JSON chunk of a binary glTF (header: magic, version, length; then chunk length and type)."""
    data = path.read_bytes()
    assert data[:4] == b"glTF"
    length, kind = struct.unpack_from("<II", data, 12)
    assert kind == 0x4E4F534A  # "JSON"
    return json.loads(data[20 : 20 + length])


def glb_faces(gltf: dict) -> int:
    return sum(gltf["accessors"][p["indices"]]["count"] for m in gltf["meshes"] for p in m["primitives"]) // 3


def guidance_overrides() -> list[str]:
    return [f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}"]


def nerf_stage(tmp_path) -> str:
    """A 2-step dreamfusion run with a small hash grid; returns its last checkpoint."""
    overrides = COMMON + guidance_overrides() + [
        f"output_root={tmp_path}",
        "tag=nerf",
        "trainer.max_steps=2",
        "trainer.run_test_after_fit=false",
        "system.field.encoding.n_levels=4",
        "system.field.encoding.log2_hashmap_size=10",
        "system.field.encoding.base_resolution=4",
        "system.renderer.steps_per_diagonal=64",
        "system.renderer.occupancy.resolution=16",
        f"system.export.threshold={THRESHOLD}",
    ]
    cfg = load_config(recipe_config("dreamfusion-sd"), overrides=overrides)
    run_dir = run_experiment("train", cfg, overrides=overrides)
    return str(run_dir / "ckpts" / "last.ckpt")


def refine_overrides(tmp_path, nerf_ckpt: str, steps: int) -> list[str]:
    return COMMON + guidance_overrides() + [
        f"output_root={tmp_path}",
        "tag=refine",
        f"trainer.max_steps={steps}",
        f"system.geometry_convert_from={nerf_ckpt}",
        "system.geometry.grid_resolution=16",
        "system.geometry.radius=0.6",  # a 16^3 grid around the blob's THRESHOLD level (radius ~0.25)
        "system.geometry.texture.radius=0.6",
        "system.geometry.texture.encoding.n_levels=4",
        "system.geometry.texture.encoding.log2_hashmap_size=10",
        "system.geometry.texture.encoding.base_resolution=4",
        "system.inherit_texture_steps=20",
        "system.inherit_texture_points=4096",
        "system.export.texture_size=64",
    ]


@pytest.mark.slow
def test_magic3d_refine_from_nerf_stage_exports_glb_and_resumes(tmp_path):
    refine_chain(tmp_path, validate=True)


@pytest.mark.gpu
def test_magic3d_refine_chain_on_cuda(tmp_path):
    """The same chain on the GPU: conversion on the trainer's device, float32 rasterization, export."""
    assert torch.cuda.is_available()
    refine_chain(tmp_path, validate=False)  # the device machine may have no node for the glTF validator


def refine_chain(tmp_path, validate: bool) -> None:
    nerf_ckpt = nerf_stage(tmp_path)
    overrides = refine_overrides(tmp_path, nerf_ckpt, steps=3)
    cfg = load_config(recipe_config("magic3d-refine"), overrides=overrides)
    run_dir = run_experiment("train", cfg, overrides=overrides)

    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert state["global_step"] == 3
    assert "geometry.sdf" in state["state_dict"] and "geometry.texture.encoding.table" in state["state_dict"]
    assert not any(k.startswith("guidance") for k in state["state_dict"])  # frozen weights stay out

    # the mesh the stage started from is the previous density's THRESHOLD level set: rebuild both
    nerf_cfg, nerf = load_previous_stage(nerf_ckpt)
    assert nerf.cfg.export.threshold == THRESHOLD
    fresh = find(cfg.system_type)(cfg.system)
    fresh.convert_from(nerf, nerf_cfg)
    mesh = fresh.geometry()
    density = nerf.density_at(mesh.vertices.detach())
    assert mesh.num_faces > 100
    assert (density - THRESHOLD).abs().median() < 0.05 * THRESHOLD

    glbs = sorted((run_dir / "save").rglob("*.glb"))
    assert glbs, f"no .glb exported under {run_dir / 'save'}"
    if validate:
        report = validate_gltf(glbs[-1])[0]
        assert report["issues"]["numErrors"] == 0, gltf_problems(report)
    gltf = glb_json(glbs[-1])
    assert gltf["images"] and gltf["textures"] and "baseColorTexture" in gltf["materials"][0]["pbrMetallicRoughness"]

    # `lift3d export` rebuilds the same DMTet mesh from the checkpoint alone (no conversion, no training)
    assert main(["export", str(run_dir / "configs" / "parsed.yaml"), "--resume", str(run_dir / "ckpts" / "last.ckpt"),
                 "--format", "obj", "system.export.stem=again"]) == 0
    obj_faces = sum(line.startswith("f ") for line in (run_dir / "save" / "again.obj").read_text().splitlines())
    assert obj_faces == glb_faces(gltf) > 100

    # resuming the refine stage from its own checkpoint continues at step 3
    resumed = refine_overrides(tmp_path, nerf_ckpt, steps=5) + [f"resume={run_dir / 'ckpts' / 'last.ckpt'}",
                                                                "trainer.run_test_after_fit=false"]
    cfg = load_config(recipe_config("magic3d-refine"), overrides=resumed)
    run_experiment("train", cfg, overrides=resumed)
    after = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert after["global_step"] == 5
    # steps 3 and 4 draw textureless shading (white albedo, lit): the shape learns, the texture rests
    assert not torch.equal(after["state_dict"]["geometry.deformation"], state["state_dict"]["geometry.deformation"])


def stage_overrides(tmp_path, tag: str, steps: int, previous: str = "") -> list[str]:
    small_texture = ["system.geometry.texture.encoding.n_levels=4", "system.geometry.texture.encoding.log2_hashmap_size=10",
                     "system.geometry.texture.encoding.base_resolution=4"]
    convert = [f"system.geometry_convert_from={previous}"] if previous else []
    return COMMON + guidance_overrides() + convert + [
        f"output_root={tmp_path}", f"tag={tag}", f"trainer.max_steps={steps}", "system.export.texture_size=64",
    ] + (small_texture + ["system.inherit_texture_steps=30", "system.inherit_texture_points=8192"] if tag != "nerf" else [])


@pytest.mark.slow
def test_prolificdreamer_geometry_then_texture_stage(tmp_path):
    nerf = stage_overrides(tmp_path, "nerf", 2) + [
        "trainer.run_test_after_fit=false", "system.field.encoding.n_levels=4", "system.field.encoding.log2_hashmap_size=10",
        "system.field.encoding.base_resolution=4", "system.renderer.steps_per_diagonal=64",
        "system.renderer.occupancy.resolution=16",
    ]
    nerf_trial = run_experiment("train", load_config(recipe_config("prolificdreamer"), overrides=nerf), overrides=nerf)

    geometry = stage_overrides(tmp_path, "geometry", 2, str(nerf_trial / "ckpts" / "last.ckpt")) + [
        "system.geometry.grid_resolution=16", "system.inherit_texture_steps=10", "system.inherit_texture_points=2048",
        "trainer.run_test_after_fit=false",
    ]
    cfg = load_config(recipe_config("prolificdreamer-geometry"), overrides=geometry)
    assert cfg.system["guidance_input"] == "normal"
    geometry_trial = run_experiment("train", cfg, overrides=geometry)
    geometry_state = load_checkpoint(geometry_trial / "ckpts" / "last.ckpt")["state_dict"]

    texture = stage_overrides(tmp_path, "texture", 2, str(geometry_trial / "ckpts" / "last.ckpt"))
    texture += ["system.geometry.grid_resolution=16"]
    texture_cfg = load_config(recipe_config("prolificdreamer-texture"), overrides=texture)
    texture_trial = run_experiment("train", texture_cfg, overrides=texture)
    checkpoint = load_checkpoint(texture_trial / "ckpts" / "last.ckpt")
    state = checkpoint["state_dict"]
    # geometry frozen at the geometry stage's; the texture field (started from it) learned by VSD; LoRA state saved
    for key in ("geometry.sdf", "geometry.deformation"):
        assert torch.equal(state[key], geometry_state[key]), key
    assert not torch.equal(state["geometry.texture.mlp.layers.0.weight"], geometry_state["geometry.texture.mlp.layers.0.weight"])
    assert "part:guidance" in checkpoint
    glbs = sorted((texture_trial / "save").rglob("*.glb"))
    assert glbs and validate_gltf(glbs[-1])[0]["issues"]["numErrors"] == 0


def test_texture_mesh_recipe_textures_spot_and_exports_a_textured_glb(tmp_path, data_dir):
    spot = data_dir / "meshes" / "spot" / "spot.obj"
    overrides = stage_overrides(tmp_path, "spot", 2) + [f"system.geometry.path={spot}", "trainer.val_check_interval=2"]
    run_dir = run_experiment("train", load_config(recipe_config("texture-mesh"), overrides=overrides), overrides=overrides)
    assert list((run_dir / "save" / "it2-val").glob("*.png"))  # a validation grid (with the guidance panel)
    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")["state_dict"]
    assert not any(k.startswith("geometry.") and not k.startswith("geometry.texture.") for k in state)  # the file is the shape
    glbs = sorted((run_dir / "save").rglob("*.glb"))
    assert glbs
    report = validate_gltf(glbs[-1])[0]
    assert report["issues"]["numErrors"] == 0, gltf_problems(report)
    gltf = glb_json(glbs[-1])
    assert "baseColorTexture" in gltf["materials"][0]["pbrMetallicRoughness"]
    assert glb_faces(gltf) == 5856  # Spot's triangles, exported as given


def test_texture_mesh_exports_land_on_the_input_file(tmp_path):
    """A y-up .glb placed away from the origin and large: the textured .glb comes back in the file's own
    coordinates (no recentring, scaling or turn), so it overlays the input."""
    import numpy as np
    import trimesh

    cone = trimesh.creation.cone(radius=2.0, height=9.0, sections=16)
    cone.apply_transform(trimesh.transformations.rotation_matrix(-np.pi / 2, [1, 0, 0]))  # its axis along +y (glTF up)
    cone.apply_translation([5.0, 2.0, -3.0])
    cone.export(str(tmp_path / "cone.glb"))
    given = trimesh.load(str(tmp_path / "cone.glb"), force="mesh")
    overrides = stage_overrides(tmp_path, "cone", 2) + [f"system.geometry.path={tmp_path / 'cone.glb'}",
                                                      "trainer.val_check_interval=2", "system.export.formats=[glb,obj]"]
    run_dir = run_experiment("train", load_config(recipe_config("texture-mesh"), overrides=overrides), overrides=overrides)
    extent = float(np.ptp(given.vertices, axis=0).max())
    for suffix in ("glb", "obj"):
        out = trimesh.load(str(sorted((run_dir / "save").rglob(f"*.{suffix}"))[-1]), force="mesh")
        distance = np.linalg.norm(out.vertices[:, None] - given.vertices[None], axis=-1)
        assert distance.min(1).max() < 1e-5 * extent and distance.min(0).max() < 1e-5 * extent, suffix
        assert np.allclose(out.bounds, given.bounds, atol=1e-5 * extent), suffix


TETRA_OBJ = """v 0 0 0
v 1 0 0
v 0 1 0
v 0 0 1
vt 0.05 0.05
vt 0.45 0.05
vt 0.05 0.45
vt 0.55 0.05
vt 0.95 0.05
vt 0.55 0.45
vt 0.05 0.55
vt 0.45 0.55
vt 0.05 0.95
vt 0.55 0.55
vt 0.95 0.55
vt 0.55 0.95
f 1/1 3/2 2/3
f 1/4 2/5 4/6
f 1/7 4/8 3/9
f 2/10 3/11 4/12
"""


@pytest.mark.parametrize("keep", [True, False])
def test_texture_mesh_bakes_into_the_files_own_uvs(tmp_path, keep):
    """An .obj with its own UV layout (one island per face): kept by default, a new atlas with keep_uvs=false."""
    import numpy as np
    import trimesh

    (tmp_path / "tetra.obj").write_text(TETRA_OBJ)
    overrides = stage_overrides(tmp_path, "tetra", 2) + [
        f"system.geometry.path={tmp_path / 'tetra.obj'}", f"system.geometry.keep_uvs={str(keep).lower()}",
        "trainer.val_check_interval=2", "system.export.formats=[obj]"]
    run_dir = run_experiment("train", load_config(recipe_config("texture-mesh"), overrides=overrides), overrides=overrides)
    out = trimesh.load(str(sorted((run_dir / "save").rglob("*.obj"))[-1]), force="mesh", process=False)
    given = np.array([[float(x) for x in line.split()[1:]] for line in TETRA_OBJ.splitlines() if line.startswith("vt ")])
    got = np.asarray(out.visual.uv)
    matched = np.linalg.norm(got[:, None] - given[None], axis=-1).min(1) < 1e-6
    assert matched.all() if keep else not matched.all()
    assert len(out.faces) == 4 and np.allclose(out.bounds, [[0, 0, 0], [1, 1, 1]], atol=1e-5)  # in the file's frame


def test_texture_mesh_starts_from_the_files_texture(tmp_path):
    """A tetrahedron whose four faces are four colors of its texture: the texture field starts from them."""
    from PIL import Image

    quadrants = {(0, 0): (230, 30, 30), (1, 0): (30, 200, 40), (0, 1): (40, 60, 220), (1, 1): (240, 220, 30)}
    image = np.zeros((64, 64, 3), np.uint8)
    for (qu, qv), color in quadrants.items():  # (u, v) quadrant; v = 0 is the image's bottom row
        image[32 * (1 - qv):32 * (2 - qv), 32 * qu:32 * (qu + 1)] = color
    Image.fromarray(image).save(tmp_path / "tetra.png")
    (tmp_path / "tetra.mtl").write_text("newmtl paint\nKd 1 1 1\nmap_Kd tetra.png\n")
    (tmp_path / "tetra.obj").write_text("mtllib tetra.mtl\nusemtl paint\n" + TETRA_OBJ)
    overrides = stage_overrides(tmp_path, "tetra", 1) + [f"system.geometry.path={tmp_path / 'tetra.obj'}",
                                                       "system.inherit_texture_steps=300"]
    cfg = load_config(recipe_config("texture-mesh"), overrides=overrides)
    system = find(cfg.system_type)(cfg.system)
    system.setup("fit")
    positions = np.array([[float(x) for x in line.split()[1:]] for line in TETRA_OBJ.splitlines() if line.startswith("v ")])
    corners = [line.split()[1:] for line in TETRA_OBJ.splitlines() if line.startswith("f ")]
    frame = system.geometry.file_frame  # the file's coordinates -> lift3d's
    for face, (quadrant, color) in zip(corners, quadrants.items()):
        inside = positions[[int(c.split("/")[0]) - 1 for c in face]].mean(0)
        centroid = torch.tensor((inside @ frame.rotation.T - frame.center) * frame.scale, dtype=torch.float32)[None]
        albedo = system.albedo_at(centroid)[0] * 255
        assert (albedo - torch.tensor(color, dtype=torch.float32)).abs().max() < 40, (quadrant, albedo, color)
