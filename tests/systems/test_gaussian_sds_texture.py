"""The gaussian-sds-texture stage (DreamGaussian's second stage): a gaussian-sds run's Gaussians meshed at
their density level into a frozen DMTet, the texture field inheriting their colors, refined by SDS.

The gaussian-sds run starts from a point cloud of known colors (a ball, red where x > 0 and blue where
x < 0) and trains one step with the tiny random Stable Diffusion, so its Gaussians keep those colors."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn

from lift3d.checkpoints import load_checkpoint
from lift3d.config import load_config
from lift3d.export import GaussianField
from lift3d.recipes import recipe_config
from lift3d.registry import find
from lift3d.rotations import quaternion_to_matrix
from lift3d.runs.runner import run_experiment
from lift3d.systems.stages import load_previous_stage
from tests.tiny_diffusion import one_thread, tiny_sd_path  # noqa: F401  (one_thread: autouse fixture)
from tests.validators import gltf_problems, validate_gltf

RED, BLUE = (0.9, 0.15, 0.1), (0.1, 0.2, 0.9)
BALL = 0.35  # radius of the point cloud
COMMON = [
    "use_timestamp=false", "trainer.enable_progress_bar=false", "trainer.val_check_interval=0",
    "checkpoint.every_n_train_steps=0", "data.height=32", "data.width=32", "data.eval_height=32", "data.eval_width=32",
    "data.n_val_views=1", "data.n_test_views=2",
]
SD = ["system.guidance.resolution=64", "system.guidance.prompt=a ball"]
SMALL_STAGE = [  # a 20^3 grid over [-0.6, 0.6]^3 (cells of 0.06) and a small texture field
    "system.geometry.grid_resolution=20", "system.geometry.radius=0.6", "system.geometry.texture.radius=0.6",
    "system.geometry.texture.encoding.n_levels=6", "system.geometry.texture.encoding.log2_hashmap_size=12",
    "system.geometry.texture.encoding.base_resolution=4", "system.inherit_texture_steps=60",
    "system.inherit_texture_points=2048", "system.export.texture_size=64",
]


def write_two_color_ball(path, n: int = 800) -> None:
    """A .ply point cloud: ``n`` points uniform in a ball of radius BALL, red for x > 0, blue for x < 0."""
    from plyfile import PlyData, PlyElement

    rng = np.random.default_rng(0)
    points = rng.normal(size=(n, 3))
    points *= (BALL * rng.random(n) ** (1 / 3) / np.linalg.norm(points, axis=1))[:, None]
    colors = np.where(points[:, :1] > 0, RED, BLUE)
    vertex = np.empty(n, dtype=[(a, "f4") for a in "xyz"] + [(c, "u1") for c in ("red", "green", "blue")])
    for i, a in enumerate("xyz"):
        vertex[a] = points[:, i]
    for i, c in enumerate(("red", "green", "blue")):
        vertex[c] = np.round(colors[:, i] * 255)
    PlyData([PlyElement.describe(vertex, "vertex")]).write(str(path))


@pytest.fixture(scope="module")
def gaussian_run(tmp_path_factory) -> str:
    """The last checkpoint of a 1-step gaussian-sds run started from the two-color ball."""
    root = tmp_path_factory.mktemp("gaussian-sds")
    write_two_color_ball(root / "ball.ply")
    overrides = COMMON + SD + [
        f"output_root={root}", "tag=ball", "trainer.max_steps=1", "trainer.run_test_after_fit=false",
        f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}", "data.batch_size=1",
        "system.gaussians.init=points", f"system.gaussians.init_path={root / 'ball.ply'}", "system.init_fit_radius=false",
        "system.renderer.tile_size=8", "system.densify.refine_start=100", "system.export.formats=[]",
    ]
    run_dir = run_experiment("train", load_config(recipe_config("gaussian-sds"), overrides=overrides), overrides=overrides)
    return str(run_dir / "ckpts" / "last.ckpt")


def texture_stage(checkpoint: str, *extra: str, guidance: list[str] = SD) -> tuple[object, object, object]:
    """The texture stage converted from ``checkpoint`` (as its setup does), and the previous run's (cfg, system)."""
    overrides = COMMON + guidance + SMALL_STAGE + [f"system.geometry_convert_from={checkpoint}", *extra]
    cfg = load_config(recipe_config("gaussian-sds-texture"), overrides=overrides)
    previous_cfg, previous = load_previous_stage(checkpoint)
    torch.manual_seed(0)
    system = find(cfg.system_type)(cfg.system)
    system.convert_from(previous, previous_cfg)
    return system, previous_cfg, previous


def brute_force_density(g, points: torch.Tensor) -> torch.Tensor:
    """sum_i o_i exp(-1/2 (x - mu_i)^T Sigma_i^-1 (x - mu_i)) over every Gaussian, cut off at 3 sigma."""
    rot = quaternion_to_matrix(g.quats.detach())
    cov = rot @ torch.diag_embed(g.scales.detach() ** 2) @ rot.transpose(1, 2)
    d = points[:, None, :] - g.means.detach()[None]
    m2 = torch.einsum("pni,nij,pnj->pn", d, torch.linalg.inv(cov), d)
    return (g.opacities.detach()[None] * torch.exp(-0.5 * m2) * (m2 <= 9.0)).sum(-1)


def test_surface_queries_are_the_gaussians_density_and_colors(gaussian_run):
    _, system = load_previous_stage(gaussian_run)
    g = system.gaussians
    points = torch.cat([torch.zeros(1, 3), torch.tensor([[0.2, 0.0, 0.0], [-0.2, 0.05, 0.0], [0.0, 0.0, 0.3], [0.9, 0.0, 0.0]])])
    assert torch.allclose(system.density_at(points), brute_force_density(g, points), rtol=1e-4, atol=1e-6)
    assert system.density_at(points)[0] > 0.3 and system.density_at(points)[-1] == 0
    colors = system.albedo_at(points)
    assert torch.allclose(colors[1], torch.tensor(RED), atol=0.05) and torch.allclose(colors[2], torch.tensor(BLUE), atol=0.05)
    assert system.density_opacity_scale == GaussianField.opacity_scale == 1.0  # unitless: the mesh stage's automatic level
    # moving the Gaussians (in place, as an optimizer step does) is seen by the next query
    with torch.no_grad():
        g.means.add_(torch.tensor([1.0, 0.0, 0.0]))
    moved = points + torch.tensor([1.0, 0.0, 0.0])
    assert torch.allclose(system.density_at(moved), brute_force_density(g, moved), rtol=1e-4, atol=1e-6)


def test_conversion_meshes_the_gaussians_and_inherits_their_colors(gaussian_run):
    system, _, previous = texture_stage(gaussian_run)
    mesh = system.geometry()
    vertices = mesh.vertices.detach()
    assert mesh.num_faces > 200
    assert system.geometry_fixed
    assert not any(p.requires_grad for n, p in system.named_parameters() if n.startswith("geometry.sdf"))
    # the surface is a closed shell around the ball: about its radius (Gaussians reach a little beyond)
    radius = vertices.norm(dim=-1)
    assert 0.25 < float(radius.median()) < 0.5 and float(radius.min()) > 0.1
    # inherited colors match the Gaussians' own at the surface, and are the ball's two colors away from x = 0
    inherited, theirs = system.albedo_at(vertices), previous.albedo_at(vertices)
    assert float((inherited - theirs).abs().mean()) < 0.05
    right, left = vertices[:, 0] > 0.12, vertices[:, 0] < -0.12
    assert right.sum() > 20 and left.sum() > 20
    assert float((inherited[right] - torch.tensor(RED)).abs().max(dim=-1).values.median()) < 0.08
    assert float((inherited[left] - torch.tensor(BLUE)).abs().max(dim=-1).values.median()) < 0.08


def test_given_threshold_wins_and_floaters_are_dropped(gaussian_run):
    system, _, previous = texture_stage(gaussian_run, "system.isosurface_threshold=0.2", "system.inherit_texture=false")
    vertices = system.geometry().vertices.detach()
    assert (previous.density_at(vertices) - 0.2).abs().median() < 0.05  # the 0.2 level set (linear along grid edges)
    # a separate blob of Gaussians in a corner of the grid: kept with isosurface_keep_components=0, dropped with 1
    g = previous.gaussians
    corner = torch.tensor([0.45, 0.45, 0.45])
    blob = {k: torch.cat([v.detach(), v.detach()[:60]]) for k, v in g.parameters_dict().items()}
    blob["means"][-60:] = blob["means"][-60:] * 0.2 + corner
    g.set_parameters(blob)
    faces = {}
    for keep in (0, 1):
        overrides = COMMON + SD + SMALL_STAGE + ["system.isosurface_threshold=0.2", "system.inherit_texture=false",
                                                 f"system.isosurface_keep_components={keep}"]
        stage = find("mesh-stage")(load_config(recipe_config("gaussian-sds-texture"), overrides=overrides).system)
        stage.convert_from(previous, SimpleNamespace(system_type="gaussian-sds"))
        faces[keep] = int((stage.geometry().vertices.detach().min(dim=-1).values > 0.3).sum())  # the ball's end at 0.3
    assert faces[0] > 0 and faces[1] == 0, faces


def test_texture_stage_trains_checkpoints_and_exports_a_textured_glb(gaussian_run, tmp_path):
    train_texture_stage(gaussian_run, tmp_path, validate=True)


@pytest.mark.gpu
def test_texture_stage_on_cuda(gaussian_run, tmp_path):
    """The same on the GPU: the Gaussians' density and colors queried there during conversion, float32 rasterization."""
    assert torch.cuda.is_available()
    # the device machine may have no node for the validator; the reference conversion runs on the CPU, so the
    # GPU's grid of densities agrees to float tolerance, not bit for bit
    train_texture_stage(gaussian_run, tmp_path, validate=False, exact=False)


def train_texture_stage(gaussian_run: str, tmp_path, validate: bool, exact: bool = True) -> None:
    overrides = COMMON + SD + SMALL_STAGE + [
        f"output_root={tmp_path}", "tag=texture", "trainer.max_steps=2", f"system.geometry_convert_from={gaussian_run}",
        f"system.guidance.pretrained_model_name_or_path={tiny_sd_path()}",
    ]
    cfg = load_config(recipe_config("gaussian-sds-texture"), overrides=overrides)
    run_dir = run_experiment("train", cfg, overrides=overrides)
    state = load_checkpoint(run_dir / "ckpts" / "last.ckpt")
    assert state["global_step"] == 2
    assert not any(k.startswith("guidance") for k in state["state_dict"])
    # the frozen mesh is the conversion's; the texture field moved away from the inherited one
    converted, _, _ = texture_stage(gaussian_run)
    sdf, reference = state["state_dict"]["geometry.sdf"].cpu(), converted.geometry.sdf.detach()
    if exact:
        assert torch.equal(sdf, reference)
    else:
        assert (sdf - reference).abs().max() < 1e-3 and ((sdf > 0) == (reference > 0)).float().mean() > 0.999
    key = "geometry.texture.mlp.layers.0.weight"
    assert not torch.equal(state["state_dict"][key], converted.state_dict()[key])
    glbs = sorted((run_dir / "save").rglob("*.glb"))
    assert glbs and glbs[-1].stat().st_size > 1000
    if validate:
        report = validate_gltf(glbs[-1])[0]
        assert report["issues"]["numErrors"] == 0, gltf_problems(report)
    import trimesh

    scene = trimesh.load(glbs[-1])
    mesh = next(iter(scene.geometry.values())) if hasattr(scene, "geometry") else scene
    faces = converted.geometry().num_faces
    assert len(mesh.faces) == faces if exact else abs(len(mesh.faces) - faces) <= 0.01 * faces
    assert mesh.visual.material.baseColorTexture is not None  # a baked texture, not vertex colors


class NoSurface(nn.Module):
    """Stands in for a run with neither a density field nor a mesh (e.g. reconstruct-gaussians)."""

    def __init__(self) -> None:
        super().__init__()
        self.gaussians = nn.Linear(1, 1)
        self.cfg = SimpleNamespace()


def test_runs_that_cannot_be_converted_raise_clear_errors(gaussian_run):
    overrides = COMMON + SD + SMALL_STAGE + ["system.inherit_texture=false"]
    stage = find("mesh-stage")(load_config(recipe_config("gaussian-sds-texture"), overrides=overrides).system)
    with pytest.raises(ValueError, match="reconstruct-gaussians run cannot start a mesh stage"):
        stage.convert_from(NoSurface(), SimpleNamespace(system_type="reconstruct-gaussians"))
    _, previous = load_previous_stage(gaussian_run)
    with torch.no_grad():
        previous.gaussians.means.add_(5.0)  # every Gaussian outside the stage's grid
    with pytest.raises(ValueError, match="empty on the grid"):
        stage.convert_from(previous, SimpleNamespace(system_type="gaussian-sds"))
    previous.gaussians.set_parameters(previous.gaussians.empty_parameters(0))
    with pytest.raises(ValueError, match="no Gaussians"):
        stage.convert_from(previous, SimpleNamespace(system_type="gaussian-sds"))


# ------------------------------------------------------------------------------ analytic-prior quality check
SIZE, FOVY, DISTANCE = 32, 45.0, 1.6
GREEN, YELLOW = (0.1, 0.75, 0.2), (0.95, 0.8, 0.1)


def orbit(n: int, elevation: float, start: float = 0.0):
    from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w

    fovy = torch.full((n,), math.radians(FOVY))
    return Cameras(orbit_c2w(n, elevation, DISTANCE, start), intrinsics_from_fovy(fovy, SIZE, SIZE), SIZE, SIZE)


@pytest.mark.filterwarnings("ignore:.*self.trainer.*")
def test_sds_with_the_analytic_prior_moves_the_inherited_texture_to_a_known_one(gaussian_run):
    """The converted mesh painted green above z = 0 and yellow below is the target: the stage starts from the
    Gaussians' red / blue and, seeing the target only through the exact denoiser of its renders, must
    approach it on held-out views."""
    from lift3d.data.random_views import RandomViewsConfig, sample_random_views
    from lift3d.guidance.analytic import AnalyticGuidance
    from lift3d.metrics import psnr
    from lift3d.render.meshes.renderer import MeshRenderer

    system, _, _ = texture_stage(gaussian_run, guidance=["system.guidance_type=analytic", "system.guidance.view_angle_deg=20",
                                                         "system.guidance.max_step_percent=0.5"])
    mesh = system.geometry()
    renderer = MeshRenderer({"background_color": [1.0, 1.0, 1.0]})

    def target(cameras):
        paint = lambda s: torch.where(s["points"][:, 2:] > 0, torch.tensor(GREEN), torch.tensor(YELLOW))  # noqa: E731
        return renderer(mesh, cameras, background=torch.ones(3), color_fn=paint)["rgb"]

    references, held_out = torch.cat([orbit(12, 0.0).c2w, orbit(12, 30.0, 15.0).c2w]), orbit(4, 15.0, 45.0)
    with torch.no_grad():
        reference_rgb = torch.cat([target(orbit(12, 0.0)), target(orbit(12, 30.0, 15.0))])
        truth = target(held_out)
    system.build_guidance = lambda: AnalyticGuidance(system.cfg.guidance, references=(reference_rgb, references))

    def score() -> float:
        with torch.no_grad():
            return float(psnr(system.eval().render({"cameras": held_out})["rgb"], truth).mean())

    before = score()
    system.train()
    views = RandomViewsConfig(height=SIZE, width=SIZE, elevation_range=[0.0, 30.0], camera_distance_range=[DISTANCE, DISTANCE],
                              fovy_range=[FOVY, FOVY], camera_perturb=0.0, center_perturb=0.0, up_perturb=0.0)
    optimizer = torch.optim.Adam(system.geometry.texture.parameters(), lr=0.02)
    for step in range(40):
        loss = system.training_step(sample_random_views(views, step, torch.Generator().manual_seed(step)), step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = score()
    print(f"texture PSNR against the target: {before:.2f} -> {after:.2f} dB")
    assert after > before + 6.0, (before, after)
