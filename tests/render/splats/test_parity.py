"""GPU: the pure-PyTorch rasterizer and gsplat give the same images and gradients on the same scenes.

Run on the device machine: ``pytest -m gpu tests/render/splats/test_parity.py`` (needs CUDA and gsplat).
"""

import json

import pytest
import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, look_at
from lift3d.render.splats.renderer import Splats, rasterize
from tests.conftest import require_gpu_and_gsplat

pytestmark = pytest.mark.gpu


def _scene(n: int, seed: int, opaque: bool, device) -> Splats:
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g) * 0.6
    scales = torch.rand(n, 3, generator=g) * (0.08 if opaque else 0.04) + 0.005
    opacities = torch.rand(n, generator=g) * (0.3 if opaque else 0.95) + (0.69 if opaque else 0.02)
    return Splats(means.to(device), torch.randn(n, 4, generator=g).to(device), scales.to(device), opacities.to(device),
                  (0.5 * torch.randn(n, 16, 3, generator=g)).to(device))


def _cameras(width: int, height: int, device) -> Cameras:
    eyes = torch.tensor([[0.3, -3.0, 1.0], [2.5, 1.5, 1.5], [-2.0, 2.2, -0.8]])
    c2w = look_at(eyes, torch.zeros(3, 3), torch.tensor([0.0, 0.0, 1.0]))
    return Cameras(c2w, intrinsics_from_fovy(torch.tensor([0.8, 0.7, 0.9]), width, height), width, height).to(device)


def _assert_images_agree(a: torch.Tensor, b: torch.Tensor, what: str) -> float:
    """Two renders of one scene agree to float32 rounding except where a splat's alpha rounds to either side of the
    1/255 skip threshold: such a pixel moves by at most that alpha, and such pixels are rare. (A 1e-7 relative
    change of the means moves the CPU render of the 20000-splat scene by 2.4e-3 at 9 of 589,824 values.)"""
    difference = (a - b).abs()
    largest, flipped = float(difference.max()), float((difference > 1e-4).float().mean())
    assert largest < 1.0 / 255.0 + 1e-4, (what, largest)
    assert flipped < 1e-3, (what, flipped)
    return largest


def _render_and_grads(scene: Splats, cameras: Cameras, background, backend: str, weights: dict):
    params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)]
    out = rasterize(Splats(*params), cameras, background=background, sh_degree=3, backend=backend)
    accumulated_depth = out["depth"] * out["alpha"]
    loss = ((out["rgb"] * weights["rgb"]).sum() + (out["alpha"] * weights["alpha"]).sum()
            + (accumulated_depth * weights["depth"]).sum())
    loss.backward()
    images = {"rgb": out["rgb"].detach(), "alpha": out["alpha"].detach(), "depth": accumulated_depth.detach()}
    grads = dict(zip(["means", "quats", "scales", "opacities", "sh"], [p.grad for p in params]))
    grads["means2d"] = out["means2d"].grad
    return images, grads, out["radii"]


@pytest.mark.parametrize("n,opaque,size", [(3000, False, (160, 120)), (20000, False, (256, 256)), (4000, True, (200, 150))])
def test_torch_and_gsplat_agree(n, opaque, size):
    device = require_gpu_and_gsplat()
    scene, cameras = _scene(n, seed=n, opaque=opaque, device=device), _cameras(*size, device=device)
    background = torch.rand(3, 3, generator=torch.Generator().manual_seed(1)).to(device)
    shape = (3, size[1], size[0])
    g = torch.Generator().manual_seed(2)
    weights = {k: torch.rand(*shape, c, generator=g).to(device) for k, c in (("rgb", 3), ("alpha", 1), ("depth", 1))}
    images_t, grads_t, radii_t = _render_and_grads(scene, cameras, background, "torch", weights)
    images_g, grads_g, radii_g = _render_and_grads(scene, cameras, background, "gsplat", weights)
    report = {}
    for key in ("rgb", "alpha"):
        report[key] = _assert_images_agree(images_t[key], images_g[key], key)
    depth_scale = float(images_g["depth"].abs().max())
    report["depth_rel"] = _assert_images_agree(images_t["depth"] / depth_scale, images_g["depth"] / depth_scale, "depth")
    assert images_g["alpha"].max() > 0.9 and images_g["alpha"].min() < 0.1  # something and nothing in view
    visible_t, visible_g = (radii_t > 0).all(-1), (radii_g > 0).all(-1)
    assert (visible_t != visible_g).float().mean() < 1e-3, "visibility differs"
    if radii_g.shape == radii_t.shape:
        assert ((radii_t - radii_g).abs() > 1).sum() == 0 and (radii_t != radii_g).float().mean() < 1e-3
    for key, reference in grads_g.items():
        error = float((grads_t[key] - reference).norm() / reference.norm().clamp_min(1e-12))
        report[f"grad_{key}"] = error
        assert error < 1e-2, (key, report)
    print(json.dumps({"case": f"n={n} opaque={opaque} size={size}", **report}))


def test_gsplat_without_depth_gives_the_same_colors_and_gradients():
    """Training steps render with_depth=False (gsplat's RGB mode): the same colors, alpha and gradients."""
    device = require_gpu_and_gsplat()
    scene, cameras = _scene(3000, seed=5, opaque=False, device=device), _cameras(160, 120, device=device)
    results = []
    for with_depth in (True, False):
        params = [t.clone().requires_grad_() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)]
        out = rasterize(Splats(*params), cameras, sh_degree=3, backend="gsplat", with_depth=with_depth)
        (out["rgb"].square().sum() + out["alpha"].sum()).backward()
        results.append((out, [p.grad for p in params]))
    (with_d, grads_d), (without, grads) = results
    assert "depth" in with_d and "depth" not in without
    assert torch.allclose(with_d["rgb"], without["rgb"], atol=1e-5)
    assert torch.allclose(with_d["alpha"], without["alpha"], atol=1e-5)
    for a, b in zip(grads_d, grads):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-3)


def test_torch_backend_is_the_same_on_gpu_and_cpu():
    device = require_gpu_and_gsplat()
    scene, cameras = _scene(2000, seed=5, opaque=False, device=device), _cameras(96, 64, device=device)
    gpu = rasterize(scene, cameras, sh_degree=3, backend="torch")
    cpu_scene = Splats(*(t.cpu() for t in (scene.means, scene.quats, scene.scales, scene.opacities, scene.sh)))
    cpu = rasterize(cpu_scene, cameras.to("cpu"), sh_degree=3, backend="torch")
    _assert_images_agree(gpu["rgb"].cpu(), cpu["rgb"], "rgb")


def test_reconstruct_the_sample_scene_with_gsplat(tmp_path):
    require_gpu_and_gsplat()
    from lift3d.cli import main

    code = main(["reconstruct", f"output_root={tmp_path}", "trainer.enable_progress_bar=false", "system.renderer.backend=gsplat",
                 "trainer.accelerator=gpu", "use_timestamp=false"])
    assert code == 0
    record = json.loads((tmp_path / "reconstruct-gaussians-sample" / "sample_scene" / "save" / "metrics.json").read_text())
    assert record["val"]["psnr"] > 29.0, record


def test_torch_backend_ignores_the_global_tf32_setting():
    """Recipes set TF32 matmuls on CUDA for their MLPs; the torch rasterizer's exponents and projections must not
    follow (in TF32 an opacity at a pixel moved by up to 0.4 and torch stopped agreeing with gsplat)."""
    device = require_gpu_and_gsplat()
    scene, cameras = _scene(3000, seed=7, opaque=False, device=device), _cameras(160, 120, device=device)
    background = torch.rand(3, 3, generator=torch.Generator().manual_seed(1)).to(device)
    g = torch.Generator().manual_seed(2)
    weights = {k: torch.rand(3, 120, 160, c, generator=g).to(device) for k, c in (("rgb", 3), ("alpha", 1), ("depth", 1))}
    images, grads, _ = _render_and_grads(scene, cameras, background, "torch", weights)
    torch.set_float32_matmul_precision("high")  # the conftest fixture restores it
    images_tf32, grads_tf32, _ = _render_and_grads(scene, cameras, background, "torch", weights)
    assert torch.get_float32_matmul_precision() == "high"  # left as the caller set it
    for key in images:
        torch.testing.assert_close(images_tf32[key], images[key], atol=1e-5, rtol=1e-5)
    for key in grads:
        torch.testing.assert_close(grads_tf32[key], grads[key], atol=1e-5, rtol=1e-4)
