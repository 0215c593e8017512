"""Camera pose refinement: the SE(3) correction math, the system's wiring (optimizer group, frozen held-out views,
checkpoint resume), and the sample scene's toy with its training poses perturbed as structure from motion leaves them
(a degree or two, a percent or two of the scene), reconstructed with refinement on and off."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import Tensor

from lift3d.cameras import Cameras, w2c_opencv
from lift3d.config import ConfigError, load_config
from lift3d.data.sample_scene import CAMERA_ANGLE_X, render_toy, sample_cameras
from lift3d.data.summary import SceneSummary
from lift3d.recipes import recipe_config
from lift3d.render.pose_refinement import (
    PoseCorrections,
    correct_c2w,
    correct_cameras,
    correct_viewmats,
    resolve_enabled,
)
from lift3d.rotations import rotation_error_deg, so3_exp, so3_log

SIDE = 32  # photo side in pixels
ROTATION_DEG = 1.5  # the perturbation of each training pose: a rotation of this angle about a random axis ...
SHIFT = 0.015  # ... and a shift of the camera center by this fraction of the scene extent, in a random direction
EXTENT = 1.1 * 4.0  # the sample scene's extent (cameras on a sphere of radius 4)
STEPS = 600  # training steps of the fits
LR = "[[0,0],[120,3e-4],[600,3e-6]]"  # the corrections' learning rate in the fits: the recipe's warm-up and decay in 600 steps


# ----------------------------------------------------------------------------------- the math
def test_zero_correction_is_the_identity():
    cameras = sample_cameras("train", 8)[:3]
    corrected = correct_cameras(cameras, torch.zeros(3, 6), EXTENT)
    assert torch.equal(corrected.c2w, cameras.c2w)
    assert torch.allclose(so3_exp(torch.zeros(2, 3)), torch.eye(3).expand(2, 3, 3))


def test_exp_map_matches_a_known_rotation():
    quarter = so3_exp(torch.tensor([0.0, 0.0, math.pi / 2]))  # a quarter turn about z takes x to y
    assert torch.allclose(quarter, torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), atol=1e-6)
    w = torch.tensor([[0.3, -0.2, 0.5], [1e-6, 2e-6, 0.0], [0.0, 1.2, 0.0]], dtype=torch.float64)
    R = so3_exp(w)
    assert torch.allclose(R.transpose(1, 2) @ R, torch.eye(3, dtype=torch.float64).expand(3, 3, 3), atol=1e-12)
    assert torch.allclose(so3_log(R), w, atol=1e-9)
    assert torch.allclose(rotation_error_deg(torch.eye(3), so3_exp(torch.tensor([0.0, math.radians(2.0), 0.0]))),
                          torch.tensor(2.0), atol=1e-3)


def test_correction_rotates_about_the_camera_center_and_shifts_it():
    cameras = sample_cameras("train", 8)[:2]
    delta = torch.tensor([[0.01, 0.0, -0.02, 0.0, 0.0, 0.1], [0.0] * 6])
    c2w = correct_c2w(cameras.c2w, delta, EXTENT)
    assert torch.allclose(c2w[0, :3, 3], cameras.c2w[0, :3, 3] + EXTENT * delta[0, :3], atol=1e-6)
    assert torch.allclose(c2w[0, :3, :3], so3_exp(delta[0, 3:]) @ cameras.c2w[0, :3, :3], atol=1e-6)
    assert torch.equal(c2w[1], cameras.c2w[1])
    # the world-to-camera form (what gsplat takes) is the same correction, without an inverse
    assert torch.allclose(correct_viewmats(w2c_opencv(cameras.c2w), delta, EXTENT), w2c_opencv(c2w), atol=1e-5)


def test_gradients_reach_the_corrections_through_the_rasterizer():
    from lift3d.gaussians.model import GaussianModel
    from lift3d.render.splats.renderer import rasterize

    gaussians = GaussianModel({"sh_degree": 1, "init_opacity": 0.5})
    gaussians.initialize(torch.randn(200, 3) * 0.5, generator=torch.Generator().manual_seed(0))
    cameras = sample_cameras("train", 16)[:2]
    cameras = Cameras(cameras.c2w, cameras.intrinsics, 16, 16, w2c_opencv(cameras.c2w))  # as the resident data serves them
    corrections = PoseCorrections({"enabled": "true"})
    corrections.resize(5, EXTENT)
    assert corrections.delta.requires_grad
    out = rasterize(gaussians, corrections(cameras, torch.tensor([1, 3])), backend="torch")
    out["rgb"].sum().backward()
    grad = corrections.delta.grad
    assert grad[1].abs().sum() > 0 and grad[3].abs().sum() > 0
    # the other photos' rows get only the mean's share (corrections are centered): the same for each, summing to zero
    assert torch.allclose(grad[0], grad[2]) and torch.allclose(grad[0], grad[4])
    assert torch.allclose(grad.sum(0), torch.zeros(6), atol=1e-4 * float(grad.abs().max()))


def test_held_out_views_and_inactive_corrections_leave_cameras_alone():
    cameras = sample_cameras("val", 8)[:2]
    corrections = PoseCorrections({"enabled": "true"})
    assert not corrections.active and not corrections.delta.requires_grad  # no photos yet: frozen, no optimizer group
    assert corrections(cameras, torch.tensor([0, 1])) is cameras
    corrections.resize(4, EXTENT)
    with torch.no_grad():
        corrections.delta.fill_(0.01)
    assert corrections(cameras, None) is cameras  # validation / test batches carry no training index


def test_enabled_auto_is_on_for_structure_from_motion_captures_only():
    assert resolve_enabled("auto", "colmap") and resolve_enabled("auto", "nerfstudio") and resolve_enabled("auto", "instant-ngp")
    assert not resolve_enabled("auto", "blender") and not resolve_enabled("auto", None)
    assert resolve_enabled("true", "blender") and not resolve_enabled("false", "colmap")
    with pytest.raises(ConfigError, match="enabled must be one of auto, true, false; got 'yes'"):
        PoseCorrections({"enabled": "yes"})
    with pytest.raises(ConfigError, match="lr must be a number >= 0; got -0.1"):
        PoseCorrections({"enabled": "true", "lr": -0.1})


# ----------------------------------------------------------------------------------- the system
def _photos(capture_format: str = "colmap", n: int = 3) -> SceneSummary:
    """The facts the system reads of its data for pose refinement: the capture's layout and its photos."""
    cameras = sample_cameras("train", 8)[torch.arange(n)]
    return SceneSummary(cameras=cameras, image_sizes=((8, 8),) * n, capture_format=capture_format)


def _system(*overrides: str):
    from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem

    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=["system.renderer.backend=torch", *overrides])
    system = ReconstructGaussiansSystem(cfg.system)
    system.gaussians.initialize(torch.randn(50, 3) * 0.5)
    return system


def test_recipes_keep_the_given_poses_by_default():
    system = _system()
    system.setup_pose_refinement(_photos(), EXTENT)
    assert str(system.cfg.pose_refinement.enabled).lower() == "false" and not system.pose_refinement.active


def test_gaussian_system_refines_the_poses_of_its_photos_in_their_own_optimizer_group():
    system = _system("system.appearance.enabled=false", "system.pose_refinement.enabled=auto")
    assert not system.pose_refinement.active
    system.setup_pose_refinement(_photos(), EXTENT)
    assert system.pose_refinement.delta.shape == (3, 6)
    groups = {g["name"]: g for g in system.configure_optimizers().param_groups}
    group = groups["pose_refinement"]
    assert group["params"][0] is system.pose_refinement.delta
    assert group["lr_schedule"] == system.cfg.pose_refinement.lr and group["lr"] == 0.0  # warmed up from zero
    assert group["weight_decay"] == system.cfg.pose_refinement.weight_decay
    assert "pose_refinement" not in system.cfg.optimizer.params  # the config is left as it was
    cameras = sample_cameras("train", 8)[:2]
    terms, _ = system.loss_terms(cameras, torch.ones(2, 3), torch.rand(2, 8, 8, 3), index=torch.tensor([0, 2]))
    (terms["l1"] + terms["ssim"]).backward()
    grad = system.pose_refinement.delta.grad
    assert grad[0].abs().sum() > 0 and grad[2].abs().sum() > 0
    assert torch.allclose(grad.sum(0), torch.zeros(6), atol=1e-4 * float(grad.abs().max()))  # centered corrections


def test_blender_objects_keep_their_poses_under_auto():
    system = _system("system.pose_refinement.enabled=auto")
    system.setup_pose_refinement(_photos("blender"), EXTENT)
    assert not system.pose_refinement.active
    assert "pose_refinement" not in {g["name"] for g in system.configure_optimizers().param_groups}


# ----------------------------------------------------------------------------------- a perturbed capture
def perturbation(n: int, seed: int) -> torch.Tensor:
    """[n, 6] corrections that move true poses to perturbed ones: ``ROTATION_DEG`` about a random axis, a shift of
    ``SHIFT`` extents in a random direction."""
    generator = torch.Generator().manual_seed(seed)
    axis = torch.nn.functional.normalize(torch.randn(n, 3, generator=generator), dim=-1)
    direction = torch.nn.functional.normalize(torch.randn(n, 3, generator=generator), dim=-1)
    return torch.cat([SHIFT * direction, math.radians(ROTATION_DEG) * axis], dim=-1)


def write_perturbed_scene(root: Path, seed: int = 0, scale: float = 1.0) -> tuple[Path, Tensor]:
    """The toy as a Blender-layout capture of opaque photos on white whose training poses are perturbed (``scale`` x
    ``perturbation``; the photos are rendered at the true poses, held-out poses are exact) -> (the folder, the true
    training c2w [N, 4, 4])."""
    for split in ("train", "val"):
        cameras = sample_cameras(split, SIDE)
        rgba = render_toy(cameras, supersample=2)
        rgb = rgba[..., :3] * rgba[..., 3:] + (1 - rgba[..., 3:])
        c2w = cameras.c2w
        if split == "train":
            truth = c2w.clone()
            c2w = correct_c2w(c2w, scale * perturbation(len(c2w), seed), EXTENT)
        (root / split).mkdir(parents=True, exist_ok=True)
        frames = []
        for i in range(len(cameras)):
            Image.fromarray((rgb[i].clamp(0, 1) * 255 + 0.5).to(torch.uint8).numpy(), "RGB").save(root / split / f"r_{i}.png")
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": c2w[i].double().numpy().tolist()})
        (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": CAMERA_ANGLE_X, "frames": frames}))
    return root, truth


def pose_errors(c2w: Tensor, truth: Tensor) -> tuple[float, float]:
    """Mean rotation error (degrees) and mean position error (fraction of the extent) of ``c2w`` against ``truth``."""
    rotation = rotation_error_deg(c2w[:, :3, :3].double(), truth[:, :3, :3].double()).mean()
    position = (c2w[:, :3, 3] - truth[:, :3, 3]).norm(dim=-1).mean() / EXTENT
    return float(rotation), float(position)


def fit_overrides(tmp_path: Path, scene: Path, tag: str, refine: str, steps: int, lr: float | str) -> list[str]:
    """The sample recipe scaled to ``steps`` on ``scene``, pose refinement ``refine`` at ``lr``."""
    return [f"output_root={tmp_path / 'out'}", f"data.root={scene}", "use_timestamp=false", f"tag={tag}",
            "trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false", "system.export.formats=[]",
            f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", "checkpoint.every_n_minutes=0",
            f"checkpoint.every_n_train_steps={steps}", "system.gaussians.init_points=2000",
            f"system.densify.refine_start={steps // 5}", f"system.densify.refine_stop={steps * 4 // 5}",
            f"system.densify.refine_every={max(steps // 10, 1)}", "system.densify.max_gaussians=6000",
            f"system.optimizer.params.gaussians\\.means.lr=[0,1.6e-4,1.6e-6,{steps},log]",
            f"system.pose_refinement.enabled={refine}", f"system.pose_refinement.lr={lr}"]


def fit(tmp_path: Path, scene: Path, tag: str, refine: str, steps: int, lr: float | str) -> tuple[float, Tensor, Path]:
    """Reconstruct ``scene`` (``fit_overrides``) -> (held-out PSNR, the corrected training c2w [N, 4, 4], the run
    folder)."""
    from lift3d.runs.runner import run_experiment

    config = recipe_config("reconstruct-gaussians-sample")
    overrides = fit_overrides(tmp_path, scene, tag, refine, steps, lr)
    run_dir = run_experiment("train", load_config(config, overrides=overrides), [config], [])
    psnr = float(json.loads((run_dir / "save" / "metrics.json").read_text())["val"]["psnr"])
    state = torch.load(run_dir / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    frames = json.loads((scene / "transforms_train.json").read_text())["frames"]
    given = torch.tensor([f["transform_matrix"] for f in frames], dtype=torch.float32)
    delta = state["pose_refinement.delta"]
    c2w = correct_c2w(given, delta - delta.mean(0), state["pose_refinement.extent"]) if len(delta) else given
    return psnr, c2w, run_dir



@pytest.mark.slow
def test_refinement_recovers_perturbed_poses_and_scores_higher(tmp_path):
    """The toy with every training pose off by 1.5 degrees and 1.5% of the extent (held-out poses exact): with
    refinement on, held-out PSNR is clearly higher than with it off at the same steps, and the corrected training
    poses are closer to the true ones than the given ones."""
    scene, truth = write_perturbed_scene(tmp_path / "scene")
    off, given, _ = fit(tmp_path, scene, "off", "false", STEPS, LR)
    on, corrected, _ = fit(tmp_path, scene, "on", "true", STEPS, LR)
    before, after = pose_errors(given, truth), pose_errors(corrected, truth)
    figures = f"PSNR on {on:.2f} dB, off {off:.2f} dB; rotation error {before[0]:.2f} -> {after[0]:.2f} degrees"
    assert before[0] == pytest.approx(ROTATION_DEG, rel=1e-3)
    assert on > off + 1.0, figures
    assert after[0] < 0.75 * before[0], figures


def test_a_resumed_run_keeps_its_corrections(tmp_path):
    """Corrections and their optimizer state are in the checkpoint: a resumed run continues from them."""
    from lift3d.runs.runner import run_experiment

    scene, _ = write_perturbed_scene(tmp_path / "scene")
    _, _, run_dir = fit(tmp_path, scene, "first", "true", 20, 1e-3)
    saved = torch.load(run_dir / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)
    delta = saved["state_dict"]["pose_refinement.delta"]
    assert delta.shape == (40, 6) and delta.abs().max() > 0.005  # 20 Adam steps of 1e-3 moved them
    groups = [g for g in saved["optimizer_states"][0]["param_groups"] if g.get("name") == "pose_refinement"]
    assert len(groups) == 1 and groups[0]["lr"] == 1e-3
    config = run_dir / "configs" / "parsed.yaml"
    cfg = load_config(str(config), overrides=[f"resume={run_dir / 'ckpts' / 'last.ckpt'}", "trainer.max_steps=21",
                                              "trainer.val_check_interval=21", "checkpoint.every_n_train_steps=21"])
    run_experiment("train", cfg, [str(config)], [])
    resumed = torch.load(run_dir / "ckpts" / "last.ckpt", map_location="cpu", weights_only=True)
    assert resumed["global_step"] == 21
    moved = (resumed["state_dict"]["pose_refinement.delta"] - delta).abs().max()
    assert moved < 2e-3, float(moved)  # one more Adam step from where it stopped (from zero it would be 5e-3 away)


# ----------------------------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("capacity", [0, 1 << 16])
def test_gradients_reach_the_corrections_through_gsplat(capacity):
    """gsplat's rasterization (and the fixed-slot render of the captured step) differentiates its ``viewmats``."""
    from lift3d.gaussians.model import GaussianModel
    from lift3d.render.splats.renderer import rasterize
    from tests.conftest import require_gpu_and_gsplat

    device = require_gpu_and_gsplat()
    gaussians = GaussianModel({"sh_degree": 1, "init_opacity": 0.5})
    gaussians.initialize(torch.randn(500, 3) * 0.5, generator=torch.Generator().manual_seed(0))
    gaussians.to(device)
    cameras = sample_cameras("train", 32)[:2].to(device)
    cameras = Cameras(cameras.c2w, cameras.intrinsics, 32, 32, cameras.w2c_opencv())
    corrections = PoseCorrections({"enabled": "true"}).to(device)
    corrections.resize(4, EXTENT)
    out = rasterize(gaussians, corrections(cameras, torch.tensor([0, 2], device=device)), backend="gsplat",
                    isect_capacity=capacity)
    out["rgb"].sum().backward()
    grad = corrections.delta.grad.cpu()
    assert grad[0].abs().sum() > 0 and grad[2].abs().sum() > 0 and torch.allclose(grad[1], grad[3])


@pytest.mark.gpu
def test_refinement_with_gsplat_and_the_captured_step(tmp_path):
    """The CPU test's perturbed capture on the GPU with gsplat and the CUDA-graph step: the step is replayed with
    refinement on, and refinement scores higher and brings the poses closer to the truth."""
    from lift3d.runs.runner import build_parts, build_trainer
    from tests.conftest import require_gpu_and_gsplat

    require_gpu_and_gsplat()
    scene, truth = write_perturbed_scene(tmp_path / "scene")
    results = {}
    for refine in ("true", "false"):
        overrides = fit_overrides(tmp_path, scene, refine, refine, STEPS, LR) + [
            "trainer.accelerator=gpu", "system.renderer.backend=gsplat", "system.cuda_graphs=true"]
        cfg = load_config(recipe_config("reconstruct-gaussians-sample"), overrides=overrides)
        trainer = build_trainer(cfg, tmp_path / refine, train=True)
        datamodule, system = build_parts(cfg)
        system.set_save_dir(tmp_path / refine / "save")
        trainer.fit(system, datamodule=datamodule)
        psnr = json.loads((tmp_path / refine / "save" / "metrics.json").read_text())["val"]["psnr"]
        c2w = system.pose_refinement.corrected_c2w(datamodule.train.cameras.c2w).cpu()
        results[refine] = (psnr, pose_errors(c2w, truth), system._graphs.step.replays if system._graphs.step else 0)
    (on, after, replays), (off, before, _) = results["true"], results["false"]
    assert replays > STEPS // 2, results  # refinement on: the step still runs as a replayed CUDA graph
    assert on > off + 1.0, results
    assert after[0] < 0.75 * before[0], results
