"""Several views per training step (data.batch_size = B) for the Gaussian recipes: one step on a batch of B views is
the mean of B single-view steps (loss, parameter gradients) and adds the same densification statistics, so one
gradient all-reduce under DDP serves B views per rank (tests/systems/test_ddp_gaussians.py trains it on two ranks)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lift3d.cameras import Cameras, intrinsics_from_fovy, orbit_c2w
from lift3d.gaussians.strategies import DefaultStrategy
from lift3d.systems.graphed_splats import SLOT_GRAIN, GraphedSplatStep
from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem
from lift3d.systems.replicas import DDP_GRAPHS_DEFAULT, DDP_GRAPHS_ENV


def _system_and_views() -> tuple[ReconstructGaussiansSystem, Cameras, torch.Tensor]:
    """The recipe's system (pure-PyTorch rasterizer, L1 + D-SSIM) with 80 Gaussians, three 16x16 views around them
    and a target photo per view."""
    system = ReconstructGaussiansSystem({"renderer": {"tile_size": 4, "backend": "torch"},
                                         "gaussians": {"sh_degree": 1, "sh_degree_interval": 0}})
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
    steps', and the densification statistics (normalized image-space gradients x B, visibility counts) equal
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


def _graph_system(world_size: int) -> SimpleNamespace:
    """What GraphedSplatStep reads of a Gaussian system: one optimizer that has stepped, gsplat, 32 bits."""
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.Adam([{"params": [param], "lr": 0.5, "name": "p"}])
    param.grad = torch.ones(4)
    optimizer.step()
    trainer = SimpleNamespace(world_size=world_size, accumulate_grad_batches=1, precision="32-true", lr_scheduler_configs=[],
                              gradient_clip_val=0.0)
    renderer = SimpleNamespace(cfg=SimpleNamespace(backend="gsplat", absgrad=False, near_plane=0.01, far_plane=1e10, eps2d=0.3))
    return SimpleNamespace(cfg=SimpleNamespace(cuda_graphs=True, nonfinite_loss="stop", isect_headroom=1.0), _trainer=trainer,
                           trainer=trainer, renderer=renderer, _all_optimizers=lambda: [optimizer], param=param,
                           densify=DefaultStrategy(), scene=None)


def _cuda_batch(views: int) -> dict:
    class CudaLike(torch.Tensor):  # a CPU tensor that says it lives on CUDA: the checks never touch its data
        @property
        def is_cuda(self) -> bool:  # type: ignore[override]
            return True

    cameras = Cameras(torch.eye(4).expand(views, 4, 4), torch.eye(3).expand(views, 3, 3), 8, 8)
    return {"rgb": torch.zeros(views, 8, 8, 3).as_subclass(CudaLike), "cameras": cameras}


def test_the_captured_step_runs_under_ddp_unless_turned_off_and_leaves_adam_out(monkeypatch):
    """Under DDP the graph replays render, loss and backward (by default; not with LIFT3D_DDP_CUDA_GRAPHS=0), never Adam's:
    the gradients are averaged over the ranks between backward and the update."""
    monkeypatch.setattr("lift3d.systems.graphed_splats.choose_backend", lambda backend, device: backend)
    monkeypatch.delenv(DDP_GRAPHS_ENV, raising=False)
    assert DDP_GRAPHS_DEFAULT
    for world_size, env, expected in ((2, None, True), (2, "0", False), (2, "1", True), (1, "0", True)):
        if env is not None:
            monkeypatch.setenv(DDP_GRAPHS_ENV, env)
        step = GraphedSplatStep(_graph_system(world_size))
        step.applies(_cuda_batch(2))  # the first step that qualifies runs eagerly
        assert step.applies(_cuda_batch(2)) is expected, (world_size, env)
    for world_size, captured in ((1, True), (2, False)):
        system = _graph_system(world_size)
        assert (GraphedSplatStep(system)._graphed_optimizer([system.param]) is not None) is captured, world_size


def test_intersection_slots_hold_a_batch_of_views(monkeypatch):
    """A batch of B views renders into one set of slots: they hold the B views that need the most, not one view's."""
    import lift3d.render.splats.gsplat_backend as splat_gsplat

    counts = torch.tensor([70_000, 200_000, 150_000, 10_000])
    monkeypatch.setattr(splat_gsplat, "view_intersections", lambda *args, **kwargs: counts)
    system = _graph_system(1)
    system.gaussians = SimpleNamespace(means=torch.zeros(3, 3), quats=torch.zeros(3, 4), scales=torch.ones(3, 3),
                                       opacities=torch.ones(3))
    step = GraphedSplatStep(system)
    for views, needed in ((1, 200_000), (2, 350_000), (3, 420_000), (4, 430_000)):
        cameras = _cuda_batch(views)["cameras"]
        step._views = {(8, 8): (torch.eye(4).expand(4, 4, 4), torch.eye(3).expand(4, 3, 3))}  # four training views
        step._size_slots(cameras)
        assert step.capacity == -(-needed // SLOT_GRAIN) * SLOT_GRAIN, views
