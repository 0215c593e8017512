"""Analytic-prior distillation on the mesh representation: the mesh-stage system's own training step,
driven by the exact denoiser over renders of textured Spot, must raise PSNR on held-out views.

Spot with its texture is the known object: the references and the held-out ground truth are renders
of it by the mesh rasterizer (UV texture); the system only ever sees the references through the prior.
"""

from __future__ import annotations

import math

import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.data.random_views import RandomViewsConfig, sample_random_views
from lift3d.guidance.analytic import AnalyticGuidance
from lift3d.meshes.io import load_mesh
from lift3d.metrics import psnr
from lift3d.render.meshes.renderer import MeshRenderer
from lift3d.systems.mesh_stages import MeshStageSystem

SIZE, FOVY, DISTANCE = 32, 45.0, 1.6
SMALL_TEXTURE = {"radius": 0.6,
                 "encoding": {"n_levels": 8, "log2_hashmap_size": 14, "base_resolution": 4, "per_level_scale": 1.5}}


def orbit(n: int, elevation: float, start: float = 0.0) -> Cameras:
    fovy = torch.full((n,), math.radians(FOVY))
    return Cameras(orbit_c2w(n, elevation, DISTANCE, start), intrinsics_from_fovy(fovy, SIZE, SIZE), SIZE, SIZE)


@pytest.fixture(scope="module")
def spot_views(data_dir):
    folder = data_dir / "meshes" / "spot"
    truth = load_mesh(folder / "spot.obj", texture_path=folder / "spot_texture.png")
    renderer = MeshRenderer({"background_color": [1.0, 1.0, 1.0]})
    references = Cameras.cat([orbit(12, 0.0), orbit(12, 30.0, 15.0)])
    held_out = orbit(4, 15.0, 45.0)  # elevation and azimuths between the references'
    with torch.no_grad():
        ref, held = renderer(truth, references), renderer(truth, held_out)
    return {"path": str(folder / "spot.obj"), "references": (ref["rgb"], references.c2w), "held_out": held_out,
            "held_rgb": held["rgb"], "held_mask": held["mask"]}


def distil(system: MeshStageSystem, steps: int, lr: float, spot_views) -> tuple[float, float, float, float]:
    """PSNR and silhouette IoU on the held-out views before and after ``steps`` training steps."""
    def score() -> tuple[float, float]:
        system.eval()
        with torch.no_grad():
            out = system.render({"cameras": spot_views["held_out"], "background": torch.ones(4, 3)})
        system.train()
        mask, truth = out["alpha"] > 0.5, spot_views["held_mask"]
        iou = float((mask & truth).sum() / (mask | truth).sum())
        return float(psnr(out["rgb"], spot_views["held_rgb"]).mean()), iou

    views = RandomViewsConfig(height=SIZE, width=SIZE, elevation_range=[0.0, 30.0], camera_distance_range=[DISTANCE, DISTANCE],
                              fovy_range=[FOVY, FOVY], camera_perturb=0.0, center_perturb=0.0, up_perturb=0.0)
    before = score()
    optimizer = torch.optim.Adam([p for p in system.parameters() if p.requires_grad], lr=lr)
    for step in range(steps):
        batch = sample_random_views(views, step, torch.Generator().manual_seed(step))
        loss = system.training_step(batch, step)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (*before, *score())


def make_system(geometry_type: str, geometry: dict, spot_views, loss: dict | None = None) -> MeshStageSystem:
    references = spot_views["references"]

    class WithReferences(MeshStageSystem):
        def build_guidance(self):
            return AnalyticGuidance(self.cfg.guidance, references=references)

    cfg = {"geometry_type": geometry_type, "geometry": geometry, "material_type": "emission",
           "background_type": "solid-color", "background": {"color": [1.0, 1.0, 1.0]},
           "guidance_type": "analytic", "guidance": {"view_angle_deg": 20.0, "min_step_percent": 0.02, "max_step_percent": 0.5},
           "loss": loss or {}}
    torch.manual_seed(0)
    return WithReferences(cfg)


@pytest.mark.filterwarnings("ignore:.*self.trainer.*")
def test_texturing_spot_with_the_analytic_prior_raises_held_out_psnr(spot_views):
    system = make_system("custom-mesh", {"path": spot_views["path"], "texture": SMALL_TEXTURE}, spot_views)
    psnr_before, iou_before, psnr_after, iou_after = distil(system, 60, 0.02, spot_views)
    assert iou_before == iou_after > 0.97  # the given shape is kept (and matches the truth's silhouettes)
    assert psnr_after > psnr_before + 4.0, (psnr_before, psnr_after)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*self.trainer.*")
def test_dmtet_shape_and_texture_from_the_analytic_prior_raise_held_out_psnr_and_iou(spot_views):
    geometry = {"grid_resolution": 24, "radius": 0.7, "shape_init_radius": 0.35, "texture_type": "hash-grid-texture",
                "texture": SMALL_TEXTURE}
    system = make_system("dmtet", geometry, spot_views, {"lambda_normal_consistency": 0.01, "lambda_laplacian_smoothness": 0.01})
    psnr_before, iou_before, psnr_after, iou_after = distil(system, 80, 0.02, spot_views)
    assert iou_after > iou_before + 0.05, (iou_before, iou_after)
    assert psnr_after > psnr_before + 3.0, (psnr_before, psnr_after)
