"""The densification interface (lift3d.gaussians.strategies.base.Strategy) and how a system builds its strategy
(lift3d.systems.densification): both strategies answer every hook the systems call."""

from types import SimpleNamespace

import pytest
import torch

from lift3d.config import ConfigError
from lift3d.gaussians.strategies import DefaultStrategy, MCMCStrategy, Strategy
from lift3d.registry import find
from lift3d.systems.base import BaseSystem
from lift3d.systems.densification import build_strategy


def test_both_strategies_are_strategies_under_their_registered_names():
    assert find("densify-3dgs") is DefaultStrategy and find("densify-mcmc") is MCMCStrategy
    assert issubclass(DefaultStrategy, Strategy) and issubclass(MCMCStrategy, Strategy)
    with pytest.raises(NotImplementedError):
        Strategy().after_backward(None, None, None, 0, 1.0)


def test_the_captured_step_hooks():
    cpu = torch.device("cpu")
    default = DefaultStrategy({"refine_stop": 100})
    assert default.captures_statistics(99) and not default.captures_statistics(100)  # nothing to gather after refine_stop
    grad2d, count = default.prepare_stats(5, cpu)
    assert grad2d is default.grad2d and count is default.count and grad2d.shape == (5,)
    assert default.prepare_stats(5, cpu)[0] is grad2d  # the same memory while the count holds: no new capture
    assert default.prepare_stats(6, cpu)[0] is not grad2d
    absgrad = DefaultStrategy({"absgrad": True})
    assert absgrad.needs_absgrad and not absgrad.captures_statistics(0) and not default.needs_absgrad
    assert not default.edits_gradients
    mcmc = MCMCStrategy()
    assert not mcmc.captures_statistics(0) and mcmc.prepare_stats(5, cpu) == () and mcmc.checkpoint_state() == {}
    assert mcmc.active(10**6) and mcmc.edits_gradients and not mcmc.needs_absgrad


def test_a_system_builds_its_strategy_and_turns_on_what_it_needs():
    kept: dict = {}
    system = SimpleNamespace(renderer=SimpleNamespace(cfg=SimpleNamespace(absgrad=False)), build_part=BaseSystem.build_part,
                             add_unsaved_part=kept.__setitem__)
    strategy = build_strategy(system, "densify-3dgs", {"absgrad": True})
    assert isinstance(strategy, DefaultStrategy) and system.renderer.cfg.absgrad  # the rasterizer sums |gradients|
    assert kept == {"densify": strategy}  # out of the state dict, checkpointed through its checkpoint_state
    system.renderer.cfg.absgrad = False
    assert isinstance(build_strategy(system, "densify-mcmc", {}), MCMCStrategy) and not system.renderer.cfg.absgrad
    with pytest.raises(ConfigError, match="system.densify_type 'gaussians' is not a densification strategy"):
        build_strategy(system, "gaussians", {})
