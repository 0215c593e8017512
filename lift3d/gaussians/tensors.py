"""Activated Gaussian parameters as one value: what renderers, exporters and file codecs pass around."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class GaussianTensors:
    """Activated Gaussian parameters, as renderers use them (no gradients needed)."""

    means: Tensor  # [N, 3] centers
    scales: Tensor  # [N, 3] standard deviations along the local axes (activated, world units)
    quats: Tensor  # [N, 4] rotations, wxyz (normalized here)
    opacities: Tensor  # [N] in 0..1 (activated)
    colors: Tensor | None = None  # [N, 3] RGB in 0..1 (e.g. 0.5 + C0 * sh_dc, converted by the caller)

    def __post_init__(self) -> None:
        n = self.means.shape[0]
        expect = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,)}
        if self.colors is not None:
            expect["colors"] = (n, 3)
        for name, shape in expect.items():
            value = getattr(self, name)
            if tuple(value.shape) != shape:
                raise ValueError(f"GaussianTensors.{name} must be {list(shape)}, got {list(value.shape)}")
        if n == 0:
            raise ValueError("there are no Gaussians to export")

    def select(self, keep: Tensor) -> GaussianTensors:
        """The Gaussians where ``keep`` [N] (bool) is true."""
        keep = keep.to(self.means.device)
        return GaussianTensors(self.means[keep], self.scales[keep], self.quats[keep], self.opacities[keep],
                               None if self.colors is None else self.colors[keep])

    def detached(self) -> GaussianTensors:
        """float32 copies without autograd history."""
        def f(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.detach().float()

        return GaussianTensors(f(self.means), f(self.scales), f(self.quats), f(self.opacities), f(self.colors))
