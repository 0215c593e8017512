"""The reconstruct-surfels recipe end to end on the built-in sample scene (CPU, few steps): the geometry terms from
their start steps, the mesh fused from the kept training views as a .glb the Khronos validator accepts, ``lift3d
export RUN`` writing that TSDF mesh, and a 3D Gaussian run's export through export.mesh_method=tsdf."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import trimesh
from scipy.spatial import cKDTree

from lift3d.cli import main
from lift3d.config import ConfigError, load_config
from lift3d.method_table import find_method, stage_recipes
from lift3d.recipes import recipe_config
from lift3d.systems.reconstruct_surfels import ReconstructSurfelsSystem
from tests.conftest import require_gpu_and_gsplat
from tests.sample_runs import finished_sample_run
from tests.validators import gltf_problems, validate_gltf

QUIET = ["trainer.enable_progress_bar=false", "use_timestamp=false"]
SMALL_EXPORT = ["system.export.resolution=48", "system.export.target_faces=3000", "system.export.texture_size=128"]


@pytest.fixture(scope="module")
def surfel_run(tmp_path_factory):
    """A 30-step ``lift3d reconstruct --method surfels`` of the sample scene, exported as .glb when training ends."""
    root = tmp_path_factory.mktemp("surfels")
    code = main(["reconstruct", "--method", "surfels", f"output_root={root}", *QUIET, *SMALL_EXPORT,
                 "trainer.max_steps=30", "trainer.val_check_interval=30", "trainer.run_test_after_fit=false",
                 "trainer.log_every_n_steps=1", "system.densify.refine_start=10", "system.densify.refine_every=10",
                 "system.normal_start=12", "system.distortion_start=6", "system.gaussians.init_points=1500"])
    assert code == 0
    return root / "reconstruct-surfels-sample" / "sample_scene"


def test_the_sample_scene_picks_the_surfels_sample_recipe():
    assert stage_recipes(find_method("surfels"), sample=True, on_cpu=True) == ["reconstruct-surfels-sample"]
    assert stage_recipes(find_method("surfels"), on_cpu=True) == ["reconstruct-surfels-cpu"]
    assert stage_recipes(find_method("surfels")) == ["reconstruct-surfels"]


def test_surfels_train_with_their_geometry_terms_and_export_a_valid_glb(surfel_run):
    with open(surfel_run / "csv_logs" / "metrics.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("train/loss_l1")]
    logged = {int(r["step"]): r for r in rows}
    assert not logged[3].get("train/loss_normal") and not logged[3].get("train/loss_distortion")
    assert float(logged[20]["train/loss_normal"]) > 0 and float(logged[20]["train/loss_distortion"]) >= 0
    assert not logged[8].get("train/loss_normal") and logged[8].get("train/loss_distortion")
    glb = surfel_run / "save" / "it30.glb"
    report = validate_gltf(glb)[0]
    assert report["issues"]["numErrors"] == 0, gltf_problems(report)
    mesh = trimesh.load(glb, force="mesh")
    assert 500 < len(mesh.faces) <= 3300
    # glTF is +y up: back to lift3d's +z up, the mesh lies where the toy stands, near the origin
    vertices = np.asarray(mesh.vertices) @ np.array([[1.0, 0, 0], [0, 0, -1], [0, 1, 0]])
    assert np.abs(vertices).max() < 2.0 and np.ptp(vertices[:, 2]) > 0.3


def test_lift3d_export_of_a_surfels_run_writes_the_tsdf_mesh(surfel_run, capsys):
    from lift3d.runs.run_dirs import load_system

    cfg = load_config(str(surfel_run / "configs" / "parsed.yaml"))
    system = load_system(cfg, surfel_run / "ckpts" / "last.ckpt")
    assert len(system.training_cameras()) == 40  # the training views came back with the checkpoint
    capsys.readouterr()
    assert main(["export", str(surfel_run), "--format", "mesh-ply", "glb", *SMALL_EXPORT,
                 "system.export.stem=exported"]) == 0
    out = capsys.readouterr()
    assert "fusing 40 rendered depths" in out.out + out.err
    mesh = trimesh.load(surfel_run / "save" / "exported-mesh.ply", force="mesh")
    assert 500 < len(mesh.faces) <= 3300
    assert validate_gltf(surfel_run / "save" / "exported.glb")[0]["issues"]["numErrors"] == 0


@pytest.mark.gpu
def test_lift3d_export_meshes_a_surfels_run_on_the_gpu_like_the_cpu(surfel_run, capsys):
    """On a CUDA machine `lift3d export` renders and fuses on the GPU; the mesh matches the CPU's (the same views and
    voxels: vertices within a fraction of a voxel, as many faces give or take a few per cent)."""
    require_gpu_and_gsplat()
    meshes = {}
    for device in ("cpu", "cuda"):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("lift3d.runs.run_dirs.export_device", lambda device=device: torch.device(device))
            capsys.readouterr()
            assert main(["export", str(surfel_run), "--format", "mesh-ply", *SMALL_EXPORT,
                         f"system.export.stem=on-{device}"]) == 0
        out = capsys.readouterr().out
        assert ("on CUDA" in out) == (device == "cuda"), out
        meshes[device] = trimesh.load(surfel_run / "save" / f"on-{device}-mesh.ply", force="mesh")
    cpu, gpu = meshes["cpu"], meshes["cuda"]
    assert abs(len(gpu.faces) - len(cpu.faces)) <= 0.05 * len(cpu.faces)
    voxel = float(np.ptp(cpu.vertices, axis=0).max()) / 48
    assert float(np.median(cKDTree(cpu.vertices).query(gpu.vertices)[0])) < 0.5 * voxel


def test_a_gaussian_run_exports_a_mesh_fused_from_its_rendered_depths(tmp_path, capsys):
    run_dir = finished_sample_run(tmp_path)
    capsys.readouterr()
    assert main(["export", str(run_dir), "--format", "mesh-ply", "system.export.mesh_method=tsdf",
                 "system.export.tsdf.views=sphere", "system.export.tsdf.sphere_views=8", "system.export.tsdf.image_size=48",
                 "system.export.resolution=32", "system.export.target_faces=2000"]) == 0
    out = capsys.readouterr()
    assert "fusing 8 rendered depths" in out.out + out.err and "no median depth" in out.out + out.err
    assert len(trimesh.load(next((run_dir / "save").glob("*-mesh.ply")), force="mesh").faces) > 100


def test_a_gaussian_run_keeps_its_views_and_writes_meshes_in_the_capture_s_frame(tmp_path):
    """A 3DGS run's checkpoint carries its training views (the views export.tsdf.views=auto fuses) and the capture's
    frame; its meshes go back into that frame. A checkpoint from before it kept them loads as in the training frame."""
    from lift3d.runs.run_dirs import load_system

    run_dir = finished_sample_run(tmp_path)
    cfg = load_config(str(run_dir / "configs" / "parsed.yaml"),
                      overrides=["system.export.resolution=24", "system.export.target_faces=0"])
    system = load_system(cfg, run_dir / "ckpts" / "last.ckpt")
    assert len(system.training_cameras()) == 40
    world = system.export_sources().mesh()
    system.world_from_capture = torch.diag(torch.tensor([2.0, 2.0, 2.0, 1.0], dtype=torch.float64))
    system.world_from_capture[:3, 3] = torch.tensor([0.5, 0.0, -1.0], dtype=torch.float64)
    captured = system.export_sources().mesh()
    np.testing.assert_allclose(captured.vertices, (world.vertices - np.array([0.5, 0.0, -1.0])) / 2, atol=1e-5)
    old = torch.load(run_dir / "ckpts" / "last.ckpt", weights_only=True)
    for name in ("train_c2w", "train_intrinsics", "train_size", "world_from_capture"):
        del old["state_dict"][name]
    torch.save(old, tmp_path / "old.ckpt")
    before = load_system(cfg, tmp_path / "old.ckpt")
    assert before.training_cameras() is None and torch.equal(before.world_from_capture, torch.eye(4, dtype=torch.float64))


def test_geometry_terms_wait_for_their_start_steps_and_bad_options_are_refused(monkeypatch):
    cfg = load_config(recipe_config("reconstruct-surfels"))
    system = ReconstructSurfelsSystem(cfg.system)
    steps = iter([0, 2999, 3000, 7000])
    monkeypatch.setattr(ReconstructSurfelsSystem, "true_global_step", property(lambda self: self._step))
    weights = []
    for system._step in steps:
        weights.append((system.loss_weight("distortion"), system.loss_weight("normal"), system.loss_weight("l1")))
    assert weights == [(0.0, 0.0, 0.8), (0.0, 0.0, 0.8), (0.01, 0.0, 0.8), (0.01, 0.05, 0.8)]
    for override, message in (("system.cuda_graphs=true", "cuda_graphs"), ("system.densify.absgrad=true", "absgrad"),
                              ("system.gaussians.flat_ratio=0", "flat_ratio"), ("system.export.tsdf.views=all", "views")):
        with pytest.raises(ConfigError, match=message):
            ReconstructSurfelsSystem(load_config(recipe_config("reconstruct-surfels"), overrides=[override]).system)


def test_surfels_start_flat_and_randomly_turned():
    from lift3d.gaussians.surfels import SurfelModel

    model = SurfelModel({"init_points": 200, "flat_ratio": 0.01})
    model.initialize(torch.rand(200, 3), generator=torch.Generator().manual_seed(0))
    scales = model.scales
    torch.testing.assert_close(scales[:, 2], 0.01 * scales[:, :2].min(-1).values)
    normals = torch.nn.functional.normalize(model.quats, dim=-1)
    assert normals[:, 0].abs().mean() < 0.8  # not all identity rotations
    with torch.no_grad():
        model.log_scales[:, 0] += 1.0  # the optimizer moves the tangent scales; the next step flattens again
    model.update_step(0, 1)
    torch.testing.assert_close(model.scales[:, 2], 0.01 * model.scales[:, :2].min(-1).values)
