"""Base classes: configurable parts (``Config`` dataclass -> ``self.cfg``) and per-step update hooks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from lift3d.config import parse_structured


class Updateable:
    """Anything that anneals: the system calls ``update_step`` once per training step."""

    def update_step(self, epoch: int, global_step: int) -> None:
        """Move scheduled state to ``global_step`` (default: nothing)."""


class Configurable:
    """A part built from a ``Config`` dataclass; ``self.cfg`` is the validated instance."""

    @dataclass
    class Config:
        pass

    cfg: Any

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = parse_structured(self.Config, cfg, path=getattr(self, "registered_name", type(self).__name__))


class BaseModule(nn.Module, Configurable, Updateable):
    """A configurable ``nn.Module``: subclasses declare ``Config`` and build themselves in ``__init__``."""

    def __init__(self, cfg: Any = None) -> None:
        nn.Module.__init__(self)
        Configurable.__init__(self, cfg)
