"""When the 3DGS step is replayed as a CUDA graph (lift3d/systems/graphed_splats.py): the conditions, on the CPU.

The capture itself needs CUDA and gsplat: tests/systems/test_graphed_splats_gpu.py."""

from types import SimpleNamespace

import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.config import ConfigError
from lift3d.data.summary import SceneSummary
from lift3d.registry import find
from lift3d.systems.graphed_splats import GraphedSplatStep
from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem


class _CudaLike(torch.Tensor):
    """A CPU tensor that says it lives on CUDA: enough for the checks, which never touch its data."""

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def _system(cuda_graphs=True, world_size=1, precision="32-true", backend="gsplat", absgrad=False, accumulate=1):
    trainer = SimpleNamespace(world_size=world_size, accumulate_grad_batches=accumulate, precision=precision)
    renderer = SimpleNamespace(cfg=SimpleNamespace(backend=backend, absgrad=absgrad))
    return SimpleNamespace(cfg=SimpleNamespace(cuda_graphs=cuda_graphs), _trainer=trainer, renderer=renderer)


def _batch(size=8, on_cuda=True):
    rgb = torch.zeros(1, size, size, 3)
    cameras = Cameras(torch.eye(4)[None], torch.eye(3)[None], size, size)
    return {"rgb": rgb.as_subclass(_CudaLike) if on_cuda else rgb, "cameras": cameras}


def _after_first(step: GraphedSplatStep, batch: dict) -> bool:
    """``applies`` on the second step (the first that qualifies always runs eagerly)."""
    step.applies(batch)
    return step.applies(batch)


def test_applies_only_to_gsplat_on_gpus_at_32_bits(monkeypatch):
    monkeypatch.setattr("lift3d.systems.graphed_splats.choose_backend", lambda backend, device: backend)
    monkeypatch.delenv("LIFT3D_DDP_CUDA_GRAPHS", raising=False)
    assert _after_first(GraphedSplatStep(_system()), _batch())
    assert _after_first(GraphedSplatStep(_system(world_size=2)), _batch())  # DDP: captured unless turned off
    assert not _after_first(GraphedSplatStep(_system()), _batch(on_cuda=False))
    monkeypatch.setenv("LIFT3D_DDP_CUDA_GRAPHS", "0")
    for refused in ({"cuda_graphs": False}, {"world_size": 2}, {"precision": "16-mixed"}, {"backend": "torch"},
                    {"absgrad": True}, {"accumulate": 2}):
        assert not _after_first(GraphedSplatStep(_system(**refused)), _batch()), refused
    assert not _after_first(GraphedSplatStep(_system()), {"cameras": _batch()["cameras"]})  # no photos: nothing to capture


def test_the_first_step_runs_eagerly_and_a_gsplat_that_fails_to_build_ends_capture(monkeypatch):
    """The first step builds gsplat's kernels outside a capture; when they fail, the renderer's fallback to PyTorch
    makes the backend torch, and no step is captured."""
    backend = {"name": "gsplat"}
    monkeypatch.setattr("lift3d.systems.graphed_splats.choose_backend", lambda configured, device: backend["name"])
    step = GraphedSplatStep(_system())
    assert not step.applies(_batch())
    backend["name"] = "torch"  # the eager render found gsplat broken
    assert not step.applies(_batch())


def test_photos_of_several_sizes_turn_capture_off_for_the_run(monkeypatch):
    monkeypatch.setattr("lift3d.systems.graphed_splats.choose_backend", lambda backend, device: backend)
    step = GraphedSplatStep(_system())
    assert _after_first(step, _batch(8)) and step.applies(_batch(8))
    assert not step.applies(_batch(16))
    assert not step.applies(_batch(8))  # off for good: a capture per size change would cost more than it saves
    assert not step.assign_gradients()  # nothing replayed: backward runs as usual


def test_headroom_below_one_is_refused_with_the_key_named():
    with pytest.raises(ConfigError, match="isect_headroom must be a number >= 1; got 0.5"):
        ReconstructGaussiansSystem({"isect_headroom": 0.5})


def _optimizer_system(scheduler=False, clip=0.0, nonfinite="stop", optimizer_cls=torch.optim.Adam, stepped=True,
                      densify="densify-3dgs"):
    """A system whose one parameter has taken an eager step (Adam's state exists) under the given trainer options."""
    param = torch.nn.Parameter(torch.ones(4))
    optimizer = optimizer_cls([{"params": [param], "lr": 0.5, "name": "p"}])
    if stepped:
        param.grad = torch.ones(4)
        optimizer.step()
        param.grad = None
    trainer = SimpleNamespace(lr_scheduler_configs=[object()] if scheduler else [], gradient_clip_val=clip)
    system = SimpleNamespace(cfg=SimpleNamespace(nonfinite_loss=nonfinite), trainer=trainer,
                             _all_optimizers=lambda: [optimizer], densify=find(densify)())
    return system, optimizer, param


def test_adam_is_captured_with_the_step_only_where_the_trainer_leaves_the_gradients_alone():
    system, optimizer, param = _optimizer_system()
    assert GraphedSplatStep(system)._graphed_optimizer([param]) is optimizer
    group = optimizer.param_groups[0]
    assert group["capturable"] and torch.is_tensor(group["lr"]) and float(group["lr"]) == 0.5
    # MCMC's regularizers add to the gradients after backward: its update cannot be captured with the step
    for refused in ({"scheduler": True}, {"clip": 1.0}, {"nonfinite": "skip"}, {"optimizer_cls": torch.optim.SGD},
                    {"stepped": False}, {"densify": "densify-mcmc"}):
        system, optimizer, param = _optimizer_system(**refused)
        assert GraphedSplatStep(system)._graphed_optimizer([param]) is None, refused
        assert not optimizer.param_groups[0].get("capturable"), refused
    system, optimizer, param = _optimizer_system()
    optimizer.state[param]["step"] = torch.tensor(1.0, device="meta")  # unfused Adam on a GPU counts on the host
    assert GraphedSplatStep(system)._graphed_optimizer([param]) is None
    system, optimizer, param = _optimizer_system()
    empty = torch.nn.Parameter(torch.zeros(0, 3, 4))  # per-photo appearance while off: no gradient, no state, ever
    optimizer.add_param_group({"params": [empty], "name": "appearance"})
    assert GraphedSplatStep(system)._graphed_optimizer([param, empty]) is optimizer


def test_a_tensor_learning_rate_follows_its_schedule_in_place_and_checkpoints_as_a_number():
    from lift3d.systems.optim import apply_lr_schedules, plain_param_groups

    param = torch.nn.Parameter(torch.ones(2))
    lr = torch.tensor(1.0)
    optimizer = torch.optim.Adam([{"params": [param], "lr": lr, "lr_schedule": [0, 1.0, 0.01, 100, "log"],
                                   "capturable": True}])
    apply_lr_schedules(optimizer, 50)
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.1)
    saved = plain_param_groups(optimizer.state_dict())
    assert saved["param_groups"][0]["lr"] == pytest.approx(0.1) and saved["param_groups"][0]["capturable"] is False
    assert optimizer.param_groups[0]["lr"] is lr  # the live optimizer keeps its tensor
    fresh = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], lr=1e-3)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.1)


def test_a_replay_that_updated_the_parameters_hands_no_gradients_to_the_trainer():
    step = GraphedSplatStep(_system())
    handed = []
    step.step = SimpleNamespace(assign_gradients=lambda: handed.append(1))
    step._replayed, step._updated = True, True
    assert step.assign_gradients() and not handed  # Lightning's optimizer.step then finds no gradient
    step._updated = False
    assert step.assign_gradients() and handed == [1]


def test_lightnings_optimizer_step_runs_the_closure_and_skips_adam_after_a_replay_that_updated():
    system, optimizer, param = _optimizer_system()
    graphs = GraphedSplatStep(system)
    assert graphs._graphed_optimizer([param]) is optimizer
    assert graphs._graphed_optimizer([param]) is optimizer and optimizer.step.skips_after_replay  # wrapped once
    before = param.detach().clone()
    ran = []

    def closure():  # Lightning's closure: the training step (here: a replay that updated) and its hooks
        ran.append(1)
        graphs._updated = True
        param.grad = torch.ones(4)  # were a gradient left, Adam would move the parameter
        return torch.tensor(2.0)

    assert float(optimizer.step(closure)) == 2.0 and ran == [1]
    assert torch.equal(param.detach(), before)  # Adam did not run
    optimizer.param_groups[0]["capturable"] = False  # a CPU parameter: the eager step below is torch's own
    optimizer.param_groups[0]["lr"] = 0.5

    def eager_closure():  # a step that was not replayed: the gradient is the optimizer's to apply
        graphs._updated = False
        param.grad = torch.ones(4)
        return torch.tensor(1.0)

    assert float(optimizer.step(eager_closure)) == 1.0
    assert not torch.equal(param.detach(), before)


def test_slots_under_a_resolution_schedule_are_sized_from_every_training_view_at_the_batchs_size():
    intrinsics = torch.tensor([[[400.0, 0.0, 200.0], [0.0, 400.0, 150.0], [0.0, 0.0, 1.0]]]).repeat(3, 1, 1)
    every = Cameras(torch.eye(4).repeat(3, 1, 1), intrinsics, 400, 300)
    system = SimpleNamespace(scene=SceneSummary(cameras=every))
    graphs = GraphedSplatStep(system)
    quarter = Cameras(torch.eye(4)[None], intrinsics[:1] / 4, 100, 75)
    viewmats, scaled = graphs._training_views(quarter)
    assert viewmats.shape == (3, 4, 4) and torch.allclose(scaled[:, :2], intrinsics[:, :2] / 4)
    _, full = graphs._training_views(every[0])
    assert torch.equal(full, intrinsics)
    odd = Cameras(torch.eye(4)[None], intrinsics[:1], 300, 300)  # another shape: the batch's own views
    assert graphs._training_views(odd)[1].shape == (1, 3, 3)
    no_photos = GraphedSplatStep(SimpleNamespace(scene=None))  # loaded without data: the batch's own views
    assert no_photos._training_views(quarter)[1].shape == (1, 3, 3)
