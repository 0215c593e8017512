"""The generator interface: a model that maps one image to a 3D representation in one forward pass.

A generator is a registered part (``@register("name")``, built with ``find(name)(cfg)``) beside the guidance:
guidance scores renders of a representation that an optimizer shapes; a generator predicts the
representation outright (TripoSR: a triplane NeRF in a fraction of a second). It hands back plain data
(``GeneratedField``: a registered field's type, its config and its weights, plus the camera the input
image is taken to be seen from), so systems build the field with their usual ``find`` and renderers,
exporters, the viewer and score-distillation refinement work on it unchanged. A generator for Gaussians
(LGM) or meshes (SF3D) returns its own dataclass in the same spirit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lift3d.base import BaseModule
from lift3d.checkpoints import CheckpointError
from lift3d.config import choice
from lift3d.registry import find

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class GeneratorLoadError(CheckpointError):
    """Generator weights or config that are missing or do not fit the model; the message names the file and the fix."""


@dataclass
class InputView:
    """The camera a generator takes its input image to be seen from, in lift3d's world (+z up, degrees)."""

    elevation_deg: float = 0.0
    azimuth_deg: float = 0.0
    distance: float = 1.9
    fovy_deg: float = 40.0


@dataclass
class GeneratedField:
    """A generated NeRF: the registered field type, its config and its weights (``state_dict`` of that field)."""

    field_type: str
    field_config: dict[str, Any]
    state: dict[str, Tensor]
    view: InputView = field(default_factory=InputView)

    def build(self) -> torch.nn.Module:
        """The field module with the generated weights (fp32, on the weights' device)."""
        module = find(self.field_type)(self.field_config)
        module.load_state_dict({k: v.float() for k, v in self.state.items()})
        return module.to(next(iter(self.state.values())).device)


@dataclass
class GeneratorConfig:
    """Options every generator has: where its weights are and how it runs."""

    pretrained_model_name_or_path: str = ""  # a Hugging Face hub id or a local folder holding the released files
    dtype: str = choice("auto", "fp32", "fp16", "bf16")  # auto (fp16 on CUDA, fp32 on the CPU), fp32, fp16 or bf16
    local_files_only: bool = False  # never contact the hub (also when HF_HUB_OFFLINE=1)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` -> fp16 on CUDA, fp32 elsewhere; a half type on the CPU falls back to fp32 (CPU kernels are slow or absent)."""
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"generator dtype must be auto, {', '.join(DTYPES)}, got '{name}'")
    return DTYPES[name] if device.type == "cuda" else torch.float32


class Generator(BaseModule):
    """Base of generators: ``load(device)`` reads the weights, ``generate(rgba)`` makes one asset from one image."""

    Config = GeneratorConfig
    output = "field"  # what generate() returns: field (GeneratedField); gaussians or mesh for later generators

    def load(self, device: torch.device | str = "cpu") -> Generator:
        """Read the released weights (once) and move to ``device`` in the configured dtype; returns self."""
        raise NotImplementedError

    def preprocess(self, rgba: Tensor) -> Tensor:
        """A cut-out [H, W, 4] (0..1, straight alpha) -> the model's input image, as the model was trained to see it."""
        raise NotImplementedError

    def generate(self, rgba: Tensor) -> GeneratedField:
        """One image [H, W, 4] (0..1, straight alpha: the object cut out) -> its 3D representation."""
        raise NotImplementedError
