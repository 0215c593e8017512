"""Densification strategies (``system.densify_type``): the ``Strategy`` hooks, 3DGS's adaptive density control
(``densify-3dgs``) and MCMC's Gaussian budget (``densify-mcmc``); their parameter surgery is ``lift3d.gaussians.ops``."""

from lift3d.gaussians.strategies.base import Strategy
from lift3d.gaussians.strategies.default import DefaultConfig, DefaultStrategy
from lift3d.gaussians.strategies.mcmc import MCMCConfig, MCMCStrategy

__all__ = ["DefaultConfig", "DefaultStrategy", "MCMCConfig", "MCMCStrategy", "Strategy"]
