"""The parameter surgery both densification strategies use (lift3d.gaussians.ops): relocation and appended copies keep
the optimizer in step (tests/gaussians/strategies/test_default.py covers duplicate, remove, split and the opacity reset)."""

import torch

from lift3d.gaussians import ops
from lift3d.gaussians.model import PARAMETER_NAMES
from tests.gaussians.strategies.test_mcmc import _adam, _model


def _state(optimizer: torch.optim.Optimizer, model, name: str) -> dict:
    return optimizer.state[getattr(model, name)]


def test_relocate_copies_the_sampled_gaussians_onto_the_dead_ones_and_restarts_both_moments():
    model = _model(8)
    optimizer = _adam(model)
    before = {name: getattr(model, name).detach().clone() for name in PARAMETER_NAMES}
    moments = {name: _state(optimizer, model, name)["exp_avg"].clone() for name in PARAMETER_NAMES}
    dead, sampled = torch.tensor([0, 5]), torch.tensor([3, 3])
    shared = {"opacity_logits": torch.tensor([-1.5, -1.5])}
    ops.relocate(model, optimizer, dead, sampled, shared)
    assert len(model) == 8
    assert torch.equal(model.opacity_logits.detach()[[0, 3, 5]], torch.full((3,), -1.5))  # the shared value, everywhere
    for name in PARAMETER_NAMES:
        p = getattr(model, name).detach()
        if name != "opacity_logits":
            assert torch.equal(p[[0, 5]], before[name][[3, 3]]) and torch.equal(p[3], before[name][3]), name
        assert torch.equal(p[[1, 2, 4, 6, 7]], before[name][[1, 2, 4, 6, 7]]), name  # the others are untouched
        state = _state(optimizer, model, name)
        assert bool((state["exp_avg"][[0, 3, 5]] == 0).all()), name
        assert torch.equal(state["exp_avg"][[1, 2, 4, 6, 7]], moments[name][[1, 2, 4, 6, 7]]), name
    assert all(p in optimizer.state for p in model.parameters())  # the optimizer tracks the new tensors


def test_add_copies_appends_copies_with_zero_moments():
    model = _model(6)
    optimizer = _adam(model)
    before = {name: getattr(model, name).detach().clone() for name in PARAMETER_NAMES}
    moments = _state(optimizer, model, "means")["exp_avg"].clone()
    sampled = torch.tensor([1, 4, 4])
    ops.add_copies(model, optimizer, sampled, {"log_scales": torch.zeros(3, 3)})
    assert len(model) == 9
    assert torch.equal(model.log_scales.detach()[[1, 4, 6, 7, 8]], torch.zeros(5, 3))  # originals and copies share it
    assert torch.equal(model.means.detach()[6:], before["means"][[1, 4, 4]])
    assert torch.equal(model.means.detach()[:6], before["means"])
    state = _state(optimizer, model, "means")
    assert torch.equal(state["exp_avg"][:6], moments) and bool((state["exp_avg"][6:] == 0).all())
    assert state["exp_avg"].shape == model.means.shape
