"""MCMC densification ("3D Gaussian Splatting as Markov Chain Monte Carlo", Kheradmand et al. 2024): a Gaussian budget.

Instead of the 3DGS thresholds, every ``refine_every`` steps the dead Gaussians (opacity <= ``min_opacity``) are moved
onto live ones drawn in proportion to their opacity, new Gaussians are added the same way (``grow_rate`` more each
time, up to ``max_gaussians``), and the means get noise every step, scaled by the position learning rate and strongest on
transparent Gaussians. A Gaussian drawn N times (itself plus N - 1 copies) gets the opacity and scale that keep the
sum of the copies' images close to the original's (the paper's Eq. 9; ``relocation``). Opacity and scale
regularizers (mean opacity, mean scale) keep Gaussians dying and small enough to be re-used; they are added to the
gradients here, so the system's loss does not change.

On CUDA the relocation uses gsplat's kernel when gsplat is installed; elsewhere its PyTorch twin. The parameter
surgery is ``lift3d.gaussians.ops`` (``relocate``, ``add_copies``). Under DDP every rank makes the same draws: they come
from generators that depend only on the step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from lift3d.config import bounded, step_count
from lift3d.gaussians import ops
from lift3d.gaussians.model import GaussianModel
from lift3d.gaussians.strategies.base import Strategy
from lift3d.registry import register
from lift3d.render.splats.project import covariance_3d
from lift3d.rng import step_generator

log = logging.getLogger("lift3d.gaussians.strategies.mcmc")
SAMPLE_STREAM = 43  # the random stream of relocation/addition draws
NOISE_STREAM = 47  # ... and of the position noise


@dataclass
class MCMCConfig:
    """The Gaussian budget and schedule of MCMC densification; defaults are gsplat's MCMCStrategy and trainer."""

    # keys renamed to one spelling per idea: the old name still loads, with a warning naming the new one
    RENAMED: ClassVar[dict[str, str]] = {"cap_max": "max_gaussians"}

    max_gaussians: int = bounded(1_000_000, low=1)  # the most Gaussians there will be (the budget)
    refine_start: int = step_count(500)  # first step (exclusive) at which Gaussians are relocated and added
    refine_stop: int = step_count(25000)  # no relocation or addition from this step on (the noise goes on)
    refine_every: int = step_count(100, low=1)  # relocate and add every N steps
    grow_rate: float = bounded(0.05, low=0)  # each refine step adds this fraction of the current count (up to max_gaussians)
    min_opacity: float = bounded(0.005, low=0, high=1)  # Gaussians at or below this opacity are dead: relocated onto live ones
    noise_lr: float = bounded(5e5, low=0)  # position noise = this x the current position learning rate x covariance x randn
    opacity_reg: float = bounded(0.01, low=0)  # weight of the mean opacity added to the loss (as a gradient)
    scale_reg: float = bounded(0.01, low=0)  # weight of the mean scale added to the loss (as a gradient)
    max_copies: int = bounded(51, low=2)  # the relocation formula's binomial table covers a Gaussian drawn this many times


def binomial_table(n_max: int) -> Tensor:
    """[n_max, n_max] float32 binomial coefficients C(n, k) (0 above the diagonal), the table gsplat's kernel reads."""
    table = torch.zeros(n_max, n_max)
    for n in range(n_max):
        for k in range(n + 1):
            table[n, k] = math.comb(n, k)
    return table


def relocation_torch(opacities: Tensor, scales: Tensor, ratios: Tensor, binoms: Tensor) -> tuple[Tensor, Tensor]:
    """The opacity [N] and scales [N, 3] of each of ``ratios`` [N] copies of a Gaussian (Eq. 9 of the MCMC paper):
    o' = 1 - (1 - o)^(1/n), s' = s o / sum_{i=1..n} sum_{k=0..i-1} C(i-1, k) (-1)^k o'^(k+1) / sqrt(k+1).
    ``ratios`` are clamped to [1, len(binoms)], as gsplat's kernel does."""
    n_max = binoms.shape[0]
    n = ratios.clamp(1, n_max).to(torch.int64)
    new_opacities = -torch.expm1(torch.log1p(-opacities) / n.to(opacities.dtype))  # 1 - (1 - o)^(1/n), no cancellation
    k = torch.arange(n_max, device=opacities.device)
    # sum over i of C(i-1, k) for i = k+1..n is C(n, k+1): one weight per k, but keep the table as the kernel does
    i = torch.arange(1, n_max + 1, device=opacities.device)
    within = (i[None, :] <= n[:, None]).to(binoms.dtype)  # [N, n_max]: rows i-1 of the table that count
    weights = within @ binoms.to(opacities.device)  # [N, n_max]: sum over i <= n of C(i-1, k)
    terms = (-1.0) ** k.to(opacities.dtype) / torch.sqrt(k.to(opacities.dtype) + 1)
    powers = new_opacities[:, None] ** (k[None] + 1).to(opacities.dtype)
    denominator = (weights * terms[None] * powers).sum(-1)
    return new_opacities, scales * (opacities / denominator)[:, None]


def relocation(opacities: Tensor, scales: Tensor, ratios: Tensor, binoms: Tensor) -> tuple[Tensor, Tensor]:
    """``relocation_torch``, on CUDA through gsplat's kernel when gsplat is installed."""
    if opacities.is_cuda:
        try:
            from gsplat.relocation import compute_relocation
        except ImportError:
            compute_relocation = None
        if compute_relocation is not None:
            return compute_relocation(opacities.float().contiguous(), scales.float().contiguous(),
                                      ratios.clone().float(), binoms.to(opacities.device).float().contiguous())
    return relocation_torch(opacities, scales, ratios, binoms)


@register("densify-mcmc")
class MCMCStrategy(Strategy):
    """MCMC densification: relocate dead Gaussians, add new ones up to ``max_gaussians``, perturb the means. It keeps no
    statistics between steps (nothing to checkpoint)."""

    Config = MCMCConfig

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.binoms = binomial_table(self.cfg.max_copies)

    @property
    def edits_gradients(self) -> bool:
        """Whether ``after_backward`` adds to the gradients (the regularizers): then the optimizer must step after it,
        not inside a captured training step."""
        return self.cfg.opacity_reg > 0 or self.cfg.scale_reg > 0

    def active(self, step: int) -> bool:
        """Always: the noise and the regularizers apply on every step."""
        return True

    def after_backward(self, out: dict[str, Tensor] | None, model: GaussianModel, optimizer: torch.optim.Optimizer | None,
                       step: int, extent: float) -> dict[str, int]:
        """One training step after its backward pass (gradients summed over DDP ranks): the regularizers' gradients,
        relocation and addition on refine steps, then the position noise. ``out`` and ``extent`` are not needed (the
        position learning rate already carries the extent)."""
        if len(model) == 0:
            return {}
        self.add_regularizer_gradients(model)
        report = self.step(model, optimizer, step)
        self.inject_noise(model, optimizer, step)
        return report

    @torch.no_grad()
    def step(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, step: int,
             extent: float = 0.0) -> dict[str, int]:
        """Relocate and add on refine steps; returns what changed (``extent`` is not needed)."""
        c = self.cfg
        if not (c.refine_start < step < c.refine_stop and step % c.refine_every == 0):
            return {}
        generator = step_generator(0, step, SAMPLE_STREAM)
        report = {"relocated": self.relocate(model, optimizer, generator)}
        report["added"] = self.add(model, optimizer, generator)
        log.debug("step %d: %s, now %d Gaussians", step, report, len(model))
        return report

    # ----------------------------------------------------------------------------------- moves
    def _draw(self, model: GaussianModel, candidates: Tensor, n: int, generator: torch.Generator) -> Tensor:
        """``n`` indices of ``candidates`` drawn with replacement in proportion to their opacity (on the host, so every
        DDP rank draws the same)."""
        probs = model.opacities.detach()[candidates].float().cpu()
        if not bool((probs > 0).any()):
            probs = torch.ones_like(probs)
        picks = torch.multinomial(probs, n, replacement=True, generator=generator)
        return candidates[picks.to(candidates.device)]

    def _shared_values(self, model: GaussianModel, sampled: Tensor) -> dict[str, Tensor]:
        """The new opacity logits and log scales of the Gaussians in ``sampled`` [n], each now shared by its copies."""
        ratios = torch.bincount(sampled, minlength=len(model))[sampled] + 1
        opacities, scales = relocation(model.opacities.detach()[sampled], model.scales.detach()[sampled], ratios,
                                       self.binoms)
        eps = torch.finfo(torch.float32).eps
        opacities = opacities.clamp(min=self.cfg.min_opacity, max=1.0 - eps)
        return {"opacity_logits": torch.logit(opacities).to(model.opacity_logits.dtype),
                "log_scales": torch.log(scales).to(model.log_scales.dtype)}

    @torch.no_grad()
    def relocate(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, generator: torch.Generator) -> int:
        """Move every dead Gaussian onto a live one drawn by opacity; the drawn ones share their opacity and scale with
        the moved ones (Eq. 9) and the optimizer moments of both start again from zero."""
        dead = model.opacities.detach() <= self.cfg.min_opacity
        n = int(dead.sum())
        if n == 0 or n == len(model):
            return 0
        dead_ids, alive_ids = dead.nonzero()[:, 0], (~dead).nonzero()[:, 0]
        sampled = self._draw(model, alive_ids, n, generator)
        ops.relocate(model, optimizer, dead_ids, sampled, self._shared_values(model, sampled))
        return n

    @torch.no_grad()
    def add(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, generator: torch.Generator) -> int:
        """Append ``grow_rate`` x the count of new Gaussians (up to ``max_gaussians``), copies of ones drawn by opacity that
        share their opacity and scale with them (Eq. 9); the copies start with zero optimizer moments."""
        current = len(model)
        n = max(0, min(self.cfg.max_gaussians, int((1.0 + self.cfg.grow_rate) * current)) - current)
        if n == 0:
            return 0
        sampled = self._draw(model, torch.arange(current, device=model.means.device), n, generator)
        ops.add_copies(model, optimizer, sampled, self._shared_values(model, sampled))
        return n

    @torch.no_grad()
    def inject_noise(self, model: GaussianModel, optimizer: torch.optim.Optimizer | None, step: int) -> None:
        """means += lr x noise_lr x covariance @ randn, weighted by sigmoid(100 (1 - opacity - 0.995)): about 0.5 for
        opacities near 0.005, under 0.02 above 0.05 (opaque Gaussians stay put); lr is the position group's current rate."""
        lr = position_lr(model, optimizer)
        if self.cfg.noise_lr <= 0 or (not torch.is_tensor(lr) and lr <= 0):
            return
        opacities = model.opacities.detach()
        weight = torch.sigmoid(100.0 * ((1.0 - opacities) - 0.995))
        device = model.means.device
        generator = torch.Generator(device=device)
        generator.manual_seed(int(step_generator(0, step, NOISE_STREAM).initial_seed()))
        noise = torch.randn(model.means.shape, generator=generator, device=device, dtype=model.means.dtype)
        noise = noise * (weight * lr * self.cfg.noise_lr)[:, None]
        covariance = covariance_3d(model.quats.detach(), model.scales.detach())
        model.means.add_((covariance @ noise[..., None])[..., 0])

    @torch.no_grad()
    def add_regularizer_gradients(self, model: GaussianModel) -> None:
        """Add the gradients of opacity_reg x mean(opacity) and scale_reg x mean(scale) to the parameters' gradients."""
        c = self.cfg
        if c.opacity_reg > 0:
            s = model.opacities.detach()
            _add_grad(model.opacity_logits, c.opacity_reg * s * (1 - s) / s.numel())
        if c.scale_reg > 0:
            scales = model.scales.detach()
            _add_grad(model.log_scales, c.scale_reg * scales / scales.numel())


def _add_grad(parameter: Tensor, grad: Tensor) -> None:
    if not parameter.requires_grad:
        return
    if parameter.grad is None:
        parameter.grad = grad.clone()
    else:
        parameter.grad.add_(grad)


def position_lr(model: GaussianModel, optimizer: torch.optim.Optimizer | None) -> float | Tensor:
    """The current learning rate of the optimizer group that holds the means (0 without one; a device tensor where a
    captured optimizer keeps it so: read without waiting for the device)."""
    if optimizer is None:
        return 0.0
    for group in optimizer.param_groups:
        if any(p is model.means for p in group["params"]):
            return group["lr"] if torch.is_tensor(group["lr"]) else float(group["lr"])
    return 0.0
