"""Where a guidance's frozen models run: ``.to(device)`` records the device, and the models follow on first use.

The frozen models live in a plain dataclass (never in a state dict), so ``nn.Module.to`` would not move them;
their dtype is the guidance's own policy, so a dtype passed to ``.to`` is ignored.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def target_device(*args: Any, **kwargs: Any) -> torch.device | None:
    """The device a ``Module.to(...)`` call names (``to(device)``, ``to(device, dtype)``, ``to(tensor)``,
    ``to(device=...)``), or None when it names only a dtype or memory format."""
    device = kwargs.get("device")
    if device is None:
        for arg in args:
            if isinstance(arg, Tensor):
                return arg.device
            if isinstance(arg, (str, int, torch.device)) and not isinstance(arg, bool):
                device = arg
                break
    return None if device is None else torch.device(device)


def runtime_dtype(dtype: torch.dtype, configured: str, device: torch.device) -> torch.dtype:
    """The dtype the models run in on ``device``: an ``auto`` half dtype falls back to fp32 off CUDA."""
    if device.type != "cuda" and dtype != torch.float32 and configured == "auto":
        return torch.float32
    return dtype


class LazyPlacement:
    """Mixin for an ``nn.Module`` whose frozen models follow it to ``execution_device`` on first use."""

    execution_device: torch.device

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """Move to a device (the frozen models follow on the next call, in the module's own dtype)."""
        device = target_device(*args, **kwargs)
        if device is not None:
            super().to(device)  # type: ignore[misc]
            self.execution_device = device
        return self
