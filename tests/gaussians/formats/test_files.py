"""Gaussian files from other tools: an Inria-layout 3DGS .ply (any SH degree, with or without normals) loads with
every attribute, renders as the in-memory model, converts through `lift3d export MODEL.ply`, and starts a run
(`system.gaussians.init=ply`) with every attribute kept."""

import json

import numpy as np
import pytest
import torch
from plyfile import PlyData, PlyElement

from lift3d.cli import main
from lift3d.config import load_config
from lift3d.export import read_splat
from lift3d.export.video import orbit_cameras
from lift3d.gaussians.formats.ply import load_ply
from lift3d.recipes import recipe_config
from lift3d.registry import find
from tests.validators import validate_gltf

REST = {0: 0, 1: 3, 2: 8, 3: 15}


def trained_gaussians(n: int, degree: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Pre-activation parameters of a small blob of Gaussians, as a trainer leaves them."""
    g = torch.Generator().manual_seed(seed)
    return {
        "means": torch.randn(n, 3, generator=g) * 0.3,
        "log_scales": torch.randn(n, 3, generator=g) * 0.3 - 3.0,
        "quats": torch.randn(n, 4, generator=g),  # stored raw, not normalized
        "opacity_logits": torch.randn(n, generator=g) + 1.0,
        "sh0": torch.randn(n, 1, 3, generator=g) * 0.8,
        "shN": torch.randn(n, REST[degree], 3, generator=g) * 0.2,
    }


def write_inria_ply(path, params: dict[str, torch.Tensor], normals: bool, extra: bool = False) -> None:
    """The layout Inria's 3DGS writes (`point_cloud.ply`), field by field with plyfile: x y z [nx ny nz] f_dc_0..2
    f_rest_* (channel-major) opacity scale_0..2 rot_0..3, float32; ``extra`` adds a field other tools write."""
    n, rest = len(params["means"]), params["shN"].shape[1]
    names = ["x", "y", "z"] + (["nx", "ny", "nz"] if normals else []) + [f"f_dc_{i}" for i in range(3)]
    names += [f"f_rest_{i}" for i in range(3 * rest)] + ["opacity"] + [f"scale_{i}" for i in range(3)]
    names += [f"rot_{i}" for i in range(4)] + (["filter_3D"] if extra else [])
    vertex = np.zeros(n, dtype=[(name, "f4") for name in names])
    for i, axis in enumerate("xyz"):
        vertex[axis] = params["means"][:, i].numpy()
    for c in range(3):
        vertex[f"f_dc_{c}"] = params["sh0"][:, 0, c].numpy()
        for k in range(rest):
            vertex[f"f_rest_{c * rest + k}"] = params["shN"][:, k, c].numpy()
        vertex[f"scale_{c}"] = params["log_scales"][:, c].numpy()
    vertex["opacity"] = params["opacity_logits"].numpy()
    for i in range(4):
        vertex[f"rot_{i}"] = params["quats"][:, i].numpy()
    PlyData([PlyElement.describe(vertex, "vertex")], byte_order="<").write(str(path))


def gaussian_system(degree: int, *overrides: str):
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=[
        f"system.gaussians.sh_degree={degree}", "system.renderer.tile_size=4", *overrides])
    return find(cfg.system_type)(cfg.system)


@pytest.mark.parametrize("degree,normals", [(0, False), (3, True), (3, False), (1, True)])
def test_inria_files_load_with_every_attribute(tmp_path, caplog, degree, normals):
    params = trained_gaussians(50, degree)
    write_inria_ply(tmp_path / "point_cloud.ply", params, normals, extra=degree == 1)
    with caplog.at_level("INFO", logger="lift3d.gaussians"):
        loaded = load_ply(tmp_path / "point_cloud.ply")
    for name, value in params.items():
        assert torch.equal(loaded[name], value), name
    assert ("ignored the properties filter_3D" in caplog.text) == (degree == 1)  # other tools' extra fields, named


def test_the_file_renders_as_the_model_in_memory(tmp_path):
    params = trained_gaussians(200, 3)
    write_inria_ply(tmp_path / "model.ply", params, normals=False)
    from_file = gaussian_system(3, "system.gaussians.init=ply", f"system.gaussians.init_path={tmp_path / 'model.ply'}")
    from_file._initialize(None)  # the run's own initialization (what setup does before the first step)
    in_memory = gaussian_system(3, "system.gaussians.sh_degree_interval=0")
    in_memory.gaussians.set_parameters(params)
    assert from_file.gaussians.active_sh_degree == 3  # the file's bands from the first step, not SH 0
    from_file.gaussians.update_step(0, 0)
    assert from_file.gaussians.active_sh_degree == 3
    cameras = orbit_cameras(2, 20.0, 2.5, 40.0, 48, 40)
    ours, reference = from_file.render_gaussians(cameras, None), in_memory.render_gaussians(cameras, None)
    assert reference["alpha"].mean() > 0.05  # the blob is in view
    assert torch.equal(ours["rgb"], reference["rgb"]) and torch.equal(ours["alpha"], reference["alpha"])


def test_lift3d_export_converts_a_file_with_no_run_behind_it(tmp_path, capsys):
    params = trained_gaussians(300, 3)
    write_inria_ply(tmp_path / "point_cloud.ply", params, normals=True)
    code = main(["export", str(tmp_path / "point_cloud.ply"), "--format", "splat", "glb", "3dgs-ply",
                 "system.export.resolution=40", "system.export.texture_size=64"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "beside" in out.out
    splat = read_splat(tmp_path / "point_cloud-ply.splat")
    order = torch.cdist(splat.means, params["means"]).argmin(dim=1)  # .splat sorts by visibility
    assert torch.allclose(splat.means, params["means"][order]) and len(order.unique()) == 300
    assert torch.allclose(splat.scales, params["log_scales"][order].exp(), rtol=1e-6)
    assert validate_gltf(tmp_path / "point_cloud-ply.glb")[0]["issues"]["numErrors"] == 0
    again = load_ply(tmp_path / "point_cloud-ply-gaussians.ply")  # the Gaussians rewritten in lift3d's own writer
    assert all(torch.equal(again[name], params[name]) for name in params)
    # a .splat from another tool converts the same way (SH 0: its colors)
    (tmp_path / "point_cloud-ply.splat").rename(tmp_path / "point_cloud.splat")
    assert main(["export", str(tmp_path / "point_cloud.splat"), "--format", "3dgs-ply"]) == 0
    from_splat = load_ply(tmp_path / "point_cloud-splat-gaussians.ply")
    assert torch.allclose(from_splat["means"], splat.means) and from_splat["shN"].shape[1] == 0


def test_a_missing_gaussian_file_is_one_clear_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "absent.ply"), "--format", "splat"]) == 2
    err = capsys.readouterr().err
    assert "Gaussian file not found" in err and "Traceback" not in err


def test_a_run_starts_from_a_trained_file(tmp_path, capsys, data_dir):
    params = trained_gaussians(400, 1)
    write_inria_ply(tmp_path / "model.ply", params, normals=False)
    code = main(["reconstruct", str(data_dir / "lego_tiny"), f"output_root={tmp_path / 'runs'}", "use_timestamp=false",
                 "trainer.enable_progress_bar=false", "trainer.max_steps=3", "trainer.val_check_interval=3",
                 "system.gaussians.init=ply", f"system.gaussians.init_path={tmp_path / 'model.ply'}",
                 "system.gaussians.sh_degree=1", "system.renderer.tile_size=4", "system.export.formats=[]",
                 "trainer.run_test_after_fit=false", "data.n_orbit_views=2"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "started from the 400 Gaussians" in err
    run_dir = next((tmp_path / "runs").rglob("metrics.json")).parent.parent
    assert json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["step"] == 3


def tall_red_cone(path, up: str) -> None:
    """A cone 3 units tall along the file's ``up`` axis ('y' or 'z'), red vertex colors, written with trimesh."""
    import trimesh

    cone = trimesh.creation.cone(radius=0.5, height=3.0, sections=24)  # along +z
    if up == "y":
        cone.apply_transform(trimesh.transformations.rotation_matrix(-np.pi / 2, [1, 0, 0]))  # +z -> +y
    cone.visual = trimesh.visual.ColorVisuals(cone, vertex_colors=np.tile([230, 20, 20, 255], (len(cone.vertices), 1)))
    cone.export(str(path))


@pytest.mark.parametrize("up", ["y", "z"])
def test_gaussians_from_a_mesh_stand_upright_in_its_colors(tmp_path, up):
    from lift3d.gaussians.init import sample_mesh

    tall_red_cone(tmp_path / "cone.glb", up)
    points, colors = sample_mesh(tmp_path / "cone.glb", 2000, up_axis=f"+{up}")
    heights = points[:, 2]
    order = heights.argsort()
    top, bottom = points[order[-200:]], points[order[:200]]
    assert top[:, 2].mean() > bottom[:, 2].mean() + 2.0  # the cone's 3 units run along world +z
    assert heights.max() - heights.min() > 2.9 and (points[:, 0].max() - points[:, 0].min()) < 1.01
    assert torch.allclose(colors, torch.tensor([230, 20, 20]) / 255.0, atol=1e-6)  # the mesh's own color


def test_a_splat_file_starts_a_model_too(tmp_path, capsys):
    from lift3d.export import GaussianTensors, rgb_from_sh_dc, write_splat
    from lift3d.gaussians.model import GaussianModel

    params = trained_gaussians(64, 0)
    tensors = GaussianTensors(params["means"], params["log_scales"].exp(), params["quats"],
                              torch.sigmoid(params["opacity_logits"]), colors=rgb_from_sh_dc(params["sh0"][:, 0]))
    write_splat(tmp_path / "model.splat", tensors)
    model = GaussianModel({"sh_degree": 1})
    assert model.load_gaussian_file(tmp_path / "model.splat") == 0 and len(model) == 64
    order = torch.cdist(model.means.detach(), params["means"]).argmin(dim=1)
    assert torch.equal(model.means.detach(), params["means"][order])
    assert torch.allclose(model.opacities.detach(), torch.sigmoid(params["opacity_logits"][order]), atol=1 / 255)
    assert model.shN.shape == (64, 3, 3) and not model.shN.any()  # degree 1 asked: the missing band is zero
    (tmp_path / "broken.splat").write_bytes(b"x" * 33)
    assert main(["export", str(tmp_path / "broken.splat"), "--format", "glb"]) == 2
    err = capsys.readouterr().err
    assert "not a .splat file" in err and "Traceback" not in err


def test_gaussian_files_can_be_pruned_for_size(tmp_path):
    params = trained_gaussians(400, 3)
    write_inria_ply(tmp_path / "model.ply", params, normals=False)
    assert main(["export", str(tmp_path / "model.ply"), "--format", "splat", "3dgs-ply",
                 "system.export.min_opacity=0.5", "system.export.max_gaussians=100",
                 "system.export.gaussian_sh_degree=0"]) == 0
    opacity = torch.sigmoid(params["opacity_logits"])
    importance = torch.where(opacity >= 0.5, params["log_scales"].exp().prod(-1) * opacity, torch.tensor(-1.0))
    expected = importance.topk(100).indices.sort().values  # the 100 most visible of those at least half opaque
    assert int((opacity >= 0.5).sum()) > 100  # so the count cap, not only the floor, decided
    pruned = load_ply(tmp_path / "model-ply-gaussians.ply")
    assert pruned["shN"].shape == (100, 0, 3)  # SH degree 0: the file lost its 45 rest coefficients
    kept = torch.cdist(pruned["means"], params["means"]).argmin(dim=1).sort().values
    assert torch.equal(kept, expected)
    assert torch.equal(pruned["sh0"], params["sh0"][torch.cdist(pruned["means"], params["means"]).argmin(dim=1)])
    splat = read_splat(tmp_path / "model-ply.splat")
    assert len(splat.means) == 100 and float(splat.opacities.min()) >= 0.5 - 1 / 255
    assert torch.equal(torch.cdist(splat.means, params["means"]).argmin(dim=1).sort().values, expected)


def test_a_bad_mesh_up_axis_is_a_config_error_before_any_work():
    from lift3d.config import ConfigError
    from lift3d.gaussians.model import GaussianModel

    with pytest.raises(ConfigError, match="init_up_axis must be one of"):
        GaussianModel({"init": "mesh", "init_path": "absent.glb", "init_up_axis": "up"})
