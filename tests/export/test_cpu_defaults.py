"""Exports on the CPU: device defaults for the costly options, and a Gaussian scene's mesh box kept to its content."""

import math

import numpy as np
import torch

from lift3d.export import ExportConfig, GaussianTensors, gaussian_bbox, gaussian_sources
from lift3d.export.config import DEVICE_DEFAULTS, for_device
from lift3d.export.gaussian_density import gaussian_mesh_box, reaching


def test_automatic_fields_follow_the_device_and_explicit_ones_stay():
    cfg = ExportConfig()
    cpu, gpu = for_device(cfg, "cpu"), for_device(cfg, torch.device("cuda"))
    for name, (on_gpu, on_cpu) in DEVICE_DEFAULTS.items():
        assert getattr(cpu, name) == on_cpu and getattr(gpu, name) == on_gpu and getattr(cfg, name) is None
    assert cpu.resolution < gpu.resolution and cpu.video_frames < gpu.video_frames
    chosen = ExportConfig(resolution=300, target_faces=0, video_frames=7, video_fps=12, video_width=64, video_height=32)
    assert for_device(chosen, "cpu") == chosen


def _ball(n: int, radius: float, scale: float, seed: int, shell: bool = False) -> GaussianTensors:
    """Gaussians filling a ball (or on its surface, as a trained object's are)."""
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(n, 3, generator=g)
    means = d / d.norm(dim=1, keepdim=True) * radius * (1.0 if shell else torch.rand(n, 1, generator=g) ** (1 / 3))
    return GaussianTensors(means, torch.full((n, 3), scale), torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1),
                           torch.full((n,), 0.9), torch.full((n, 3), 0.5))


def _scene() -> tuple[GaussianTensors, GaussianTensors]:
    """An object (a ball of radius 0.5) and a scene: the same object inside a far shell of big background Gaussians
    (2.5% of them: a percentile's worth, the strays a trained object's file holds)."""
    obj = _ball(3120, 0.5, 0.05, 0)
    g = torch.Generator().manual_seed(1)
    d = torch.randn(80, 3, generator=g)
    far = d / d.norm(dim=1, keepdim=True) * (10 + 20 * torch.rand(80, 1, generator=g))
    scene = GaussianTensors(torch.cat([obj.means, far]), torch.cat([obj.scales, torch.full((80, 3), 2.0)]),
                            torch.cat([obj.quats, obj.quats[:80]]), torch.cat([obj.opacities, torch.full((80,), 0.9)]),
                            torch.cat([obj.colors, torch.full((80, 3), 0.2)]))
    return obj, scene


def test_an_objects_mesh_box_is_all_of_it_and_a_scenes_is_its_content():
    obj, scene = _scene()
    shell = _ball(3000, 0.5, 0.02, 2, shell=True)
    assert np.allclose(gaussian_mesh_box(shell), gaussian_bbox(shell))  # nothing of an object's surface is cut
    assert (np.abs(gaussian_mesh_box(obj)) > 0.5 + 2 * 0.05).all()  # a filled ball: only its faintest tails
    box = gaussian_mesh_box(scene)
    assert (np.abs(box) < 1.5).all() and (box[1] - box[0] > 1.0).all()  # around the ball, not the 60-unit background
    assert np.abs(gaussian_bbox(scene)).max() > 30
    reach = reaching(scene, box)
    assert reach[: len(obj.means)].all() and int(reach.sum()) < len(obj.means) + 8  # few of the far ones reach it


def test_a_scene_meshes_its_object_on_a_fine_grid():
    _, scene = _scene()
    cfg = ExportConfig(resolution=40, target_faces=0, texture_size=0)
    mesh = gaussian_sources(scene, cfg).mesh()
    radii = np.linalg.norm(mesh.vertices, axis=1)
    assert radii.max() < 0.8 and radii.min() > 0.3  # the ball's surface, at ~40 samples across the content
    spacing = np.median(np.linalg.norm(mesh.vertices[mesh.faces[:, 0]] - mesh.vertices[mesh.faces[:, 1]], axis=1))
    assert spacing < 2 * 1.5 / 40 * math.sqrt(2)
