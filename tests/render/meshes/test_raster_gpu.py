"""GPU twins of the mesh rasterizer tests (run on the device machine: pytest -m gpu)."""

from __future__ import annotations

import math

import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.meshes.mesh import Mesh
from lift3d.meshes.primitives import sphere_with_faces
from lift3d.registry import find

pytestmark = pytest.mark.gpu


def cameras(n: int, size: int) -> Cameras:
    c2w = orbit_c2w(n, elevation_deg=20.0, distance=1.8)
    return Cameras(c2w, intrinsics_from_fovy(torch.full((n,), math.radians(45.0)), size, size), size, size)


def render(mesh: Mesh, cams: Cameras, device: str):
    vertices = mesh.vertices.to(device).clone().requires_grad_()
    colors = (mesh.vertices.to(device) + 0.5).clamp(0, 1)
    out = find("mesh-rasterizer")()(Mesh(vertices, mesh.faces.to(device), vertex_colors=colors), cams.to(device))
    (out["rgb"].mean() + out["alpha"].mean()).backward()
    return {k: v.detach().cpu() for k, v in out.items()}, vertices.grad.cpu()


def test_cuda_matches_cpu():
    mesh = sphere_with_faces(20000, bumps=0.08)
    cams = cameras(2, 192)
    cpu, grad_cpu = render(mesh, cams, "cpu")
    gpu, grad_gpu = render(mesh, cams, "cuda")
    same = cpu["face_ids"] == gpu["face_ids"]
    assert same.float().mean() > 0.999
    inside = same[..., None].expand_as(cpu["rgb"])
    torch.testing.assert_close(gpu["rgb"][inside], cpu["rgb"][inside], atol=1e-3, rtol=0)
    assert (gpu["alpha"] - cpu["alpha"]).abs().mean() < 1e-3
    assert (grad_gpu - grad_cpu).norm() < 2e-2 * grad_cpu.norm()


def test_512_with_100k_faces_fits_in_memory():
    mesh = sphere_with_faces(100000, bumps=0.08, device="cuda")
    torch.cuda.reset_peak_memory_stats()
    out, grad = render(mesh, cameras(4, 512), "cuda")
    assert out["alpha"].shape == (4, 512, 512, 1) and grad.abs().sum() > 0
    assert torch.cuda.max_memory_allocated() < 8 * 2**30


def test_dmtet_renders_and_backpropagates_on_cuda():
    geometry = find("dmtet")({"grid_resolution": 64}).cuda()
    out = find("mesh-rasterizer")()(geometry(), cameras(2, 512).to("cuda"))
    out["alpha"].mean().backward()
    assert geometry.sdf.grad.abs().sum() > 0 and geometry.deformation.grad.abs().sum() > 0
