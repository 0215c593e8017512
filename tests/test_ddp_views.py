"""Several views per training step (data.batch_size = B) for the Gaussian recipes: one step on a batch of B views is
the mean of B single-view steps (loss, parameter gradients) and adds the same densification statistics, so one
gradient all-reduce under DDP serves B views per rank (tests/test_ddp_gaussians.py trains it on two ranks)."""

from __future__ import annotations

import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem


def _system_and_views() -> tuple[ReconstructGaussiansSystem, Cameras, torch.Tensor]:
    """The recipe's system (pure-PyTorch rasterizer, L1 + D-SSIM) with 80 Gaussians, three 16x16 views around them
    and a target photo per view."""
    system = ReconstructGaussiansSystem({"renderer": {"tile_size": 4, "backend": "torch"}, "gaussians": {"sh_degree": 1, "sh_degree_interval": 0}})
    g = torch.Generator().manual_seed(7)
    system.gaussians.initialize(torch.randn(80, 3, generator=g) * 0.8, torch.rand(80, 3, generator=g), g)
    with torch.no_grad():
        system.gaussians.log_scales.copy_(torch.log(torch.rand(80, 3, generator=g) * 0.1 + 0.02))
        system.gaussians.opacity_logits.copy_(torch.randn(80, generator=g))
        system.gaussians.shN.copy_(torch.randn_like(system.gaussians.shN) * 0.1)
    c2w = orbit_c2w(3, 25.0, 3.0, start_azimuth_deg=15.0)
    cameras = Cameras(c2w, intrinsics_from_fovy(torch.full((3,), 0.7), 16, 16), 16, 16)
    return system, cameras, torch.rand(3, 16, 16, 3, generator=g)


def _step(system: ReconstructGaussiansSystem, cameras: Cameras, targets: torch.Tensor, background: torch.Tensor):
    """One training step's loss, parameter gradients and render (its loss backpropagated)."""
    system.zero_grad(set_to_none=True)
    terms, out = system.loss_terms(cameras, background, targets)
    loss = system.weighted_sum(terms)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in system.gaussians.named_parameters()}
    return loss.detach(), grads, out


def test_a_batch_of_two_views_is_the_mean_of_two_single_view_steps():
    """B = 2 views in one render: the loss and every parameter's gradient equal the mean of the two single-view
    steps', and the densification statistics (normalised image-space gradients x B, visibility counts) equal
    the sums of the two single-view updates: per view, a Gaussian gathers the same statistics in either."""
    system, cameras, targets = _system_and_views()
    background = torch.tensor([[1.0, 1.0, 1.0], [0.2, 0.4, 0.6]])
    pair = torch.tensor([0, 2])
    loss, grads, out = _step(system, cameras[pair], targets[pair], background)
    system.densify.update(out)
    batched = (system.densify.grad2d.clone(), system.densify.count.clone())
    system.densify.grad2d = system.densify.count = None
    singles = []
    for k, view in enumerate(pair.tolist()):
        single = _step(system, cameras[view : view + 1], targets[view : view + 1], background[k : k + 1])
        system.densify.update(single[2])
        singles.append(single)
    assert torch.allclose(loss, (singles[0][0] + singles[1][0]) / 2, rtol=1e-5, atol=1e-7)
    for name, grad in grads.items():
        mean = (singles[0][1][name] + singles[1][1][name]) / 2
        assert float(grad.abs().max()) > 0, name
        assert torch.allclose(grad, mean, rtol=1e-4, atol=1e-8), (name, float((grad - mean).abs().max()))
    assert torch.allclose(batched[0], system.densify.grad2d, rtol=1e-4, atol=1e-9)
    assert torch.equal(batched[1], system.densify.count)
    assert float(batched[1].max()) == 2.0 and bool((batched[1] == 1).any())  # some seen by both views, some by one
