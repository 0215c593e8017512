"""Stage conversion of the mesh-stage system, against an analytic 'previous stage': a Gaussian density
blob whose level sets are spheres of known radius, with a known albedo."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from lift3d.systems.mesh_stages import MeshStageSystem

PEAK, WIDTH = 10.0, 0.3  # density = PEAK exp(-|x|^2 / (2 WIDTH^2))


def level_radius(threshold: float) -> float:
    return WIDTH * math.sqrt(2 * math.log(PEAK / threshold))


class BlobStage(nn.Module):
    """Stands in for a NeRF run: ``density_at``, ``albedo_at`` and its validated config."""

    def __init__(self, export_threshold: float | None) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(1))
        self.cfg = SimpleNamespace(export=SimpleNamespace(threshold=export_threshold))

    def density_at(self, points: torch.Tensor) -> torch.Tensor:
        return PEAK * torch.exp(-points.square().sum(-1) / (2 * WIDTH**2))

    def albedo_at(self, points: torch.Tensor) -> torch.Tensor:
        return (0.5 + points).clamp(0, 1)


def stage(**system) -> MeshStageSystem:
    geometry = {"grid_resolution": 24, "radius": 0.6, "shape_init": "none", "texture_type": "hash-grid-texture",
                "texture": {"radius": 0.6, "encoding": {"n_levels": 6, "log2_hashmap_size": 12, "base_resolution": 4}}}
    torch.manual_seed(0)
    return MeshStageSystem({"geometry": geometry, "material_type": "emission", "inherit_texture_steps": 150,
                            "inherit_texture_points": 4096, **system})


@pytest.mark.parametrize("given, carried, expected", [(None, 5.0, 5.0), (3.0, 5.0, 3.0)])
def test_density_conversion_meshes_the_threshold_level_set(given, carried, expected):
    system = stage(isosurface_threshold=given, inherit_texture=False)
    system.convert_from(BlobStage(carried), SimpleNamespace(system_type="dreamfusion"))
    mesh = system.geometry()
    radius = mesh.vertices.detach().norm(dim=-1)
    cell = 1.2 / 24
    assert abs(float(radius.mean()) - level_radius(expected)) < 0.25 * cell
    assert float((radius - level_radius(expected)).abs().max()) < cell


def test_automatic_threshold_and_inherited_albedo():
    system = stage()
    system.convert_from(BlobStage(None), SimpleNamespace(system_type="dreamfusion"))
    mesh = system.geometry()
    assert 0.1 < float(mesh.vertices.detach().norm(dim=-1).mean()) < level_radius(0.5)  # a surface, inside the blob's tail
    points = mesh.vertices.detach()
    error = (system.albedo_at(points) - BlobStage(None).albedo_at(points)).abs().mean()
    assert float(error) < 0.03  # the texture field took over the previous colors


def test_conversion_errors_name_the_problem(data_dir):
    spot = str(data_dir / "meshes" / "spot" / "spot.obj")
    custom = MeshStageSystem({"geometry_type": "custom-mesh", "geometry": {"path": spot}})
    with pytest.raises(ValueError, match="only a dmtet geometry"):
        custom.convert_from(BlobStage(5.0), SimpleNamespace(system_type="dreamfusion"))
    coarse, fine = stage(), stage(geometry={"grid_resolution": 8, "shape_init": "sphere", "texture_type": "hash-grid-texture"})
    with pytest.raises(ValueError, match="grid_resolution"):
        fine.convert_from(coarse, SimpleNamespace(system_type="mesh-stage"))
    with pytest.raises(ValueError, match="guidance_input"):
        stage(guidance_input="depth")
