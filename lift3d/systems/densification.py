"""A Gaussian system's densification strategy (``system.densify_type`` / ``system.densify``), built and wired once."""

from __future__ import annotations

from typing import Any

from lift3d.config import ConfigError
from lift3d.gaussians.strategies import Strategy


def build_strategy(system: Any, type_name: str, cfg: Any) -> Strategy:
    """The strategy registered as ``type_name`` for ``system`` (a ``BaseSystem`` with a splat ``renderer``): kept out of
    the state dict (its ``checkpoint_state`` is saved instead), and the rasterizer told to sum absolute gradients
    when the strategy reads them."""
    strategy = system.build_part(type_name, cfg)
    if not isinstance(strategy, Strategy):
        raise ConfigError(f"system.densify_type '{type_name}' is not a densification strategy (a subclass of "
                          "lift3d.gaussians.strategies.Strategy): use densify-3dgs or densify-mcmc")
    if strategy.needs_absgrad:  # growing by absolute gradients needs the rasterizer to sum them
        system.renderer.cfg.absgrad = True
    system.add_unsaved_part("densify", strategy)
    return strategy
