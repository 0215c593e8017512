"""Chaining stages: a run starts from a previous run's checkpoint (``system.geometry_convert_from``).

The previous run's run folder holds its config (``configs/parsed.yaml``) beside its checkpoints, so
its system can be rebuilt exactly and its weights loaded (``weights_only``). The new system then takes
what it needs through its ``convert_from(previous, previous_cfg)`` hook: a NeRF copies a field, a mesh
stage meshes the previous density, a texture stage inherits colors.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torch import nn

from lift3d.checkpoints import CheckpointError, load_checkpoint
from lift3d.config import ExperimentConfig, load_config
from lift3d.registry import find

log = logging.getLogger(__name__)


def previous_config_path(checkpoint: str | Path) -> Path:
    """``<run>/configs/parsed.yaml`` of a checkpoint at ``<run>/ckpts/<name>.ckpt``."""
    checkpoint = Path(checkpoint).expanduser()
    if not checkpoint.is_file():
        raise CheckpointError(
            f"system.geometry_convert_from names {checkpoint}, which does not exist: give the previous stage's "
            "checkpoint, e.g. outputs/<name>/<tag>/ckpts/last.ckpt"
        )
    config = checkpoint.resolve().parent.parent / "configs" / "parsed.yaml"
    if not config.is_file():
        raise CheckpointError(
            f"no {config} beside the checkpoint {checkpoint}: a stage starts from a checkpoint inside its run_dir "
            "folder (<run>/ckpts/x.ckpt with <run>/configs/parsed.yaml), so its config can be read"
        )
    return config


def _dotlist(prefix: str, value: Any) -> list[str]:
    """``{"a": {"b": 1}}`` under ``prefix`` -> ``["prefix.a.b=1"]`` (values as JSON, which YAML reads)."""
    if isinstance(value, dict) and value:
        return [item for key, sub in value.items() for item in _dotlist(f"{prefix}.{key}", sub)]
    return [f"{prefix}={json.dumps(value)}"]


def load_previous_stage(checkpoint: str | Path, system_override: dict | None = None) -> tuple[ExperimentConfig, Any]:
    """The previous stage's experiment config and its system with the checkpoint's weights (on the CPU).

    ``system_override`` changes the previous system's config before it is built (e.g. an export threshold)."""
    config = previous_config_path(checkpoint)
    overrides = _dotlist("system", system_override) if system_override else []
    cfg = load_config(config, overrides=overrides)
    system = find(cfg.system_type)(cfg.system)
    state = load_checkpoint(checkpoint)
    system.on_load_checkpoint(state)
    system.load_state_dict(state["state_dict"])
    log.info("starting from %s (a %s run at step %d)", checkpoint, cfg.system_type, system.true_global_step)
    return cfg, system.eval()


def copy_matching_parts(system: Any, previous: Any, names: tuple[str, ...], same_type: bool = False) -> list[str]:
    """Load each part ``names`` of ``previous`` into the system's part of that name where their parameters match in
    names and shapes (``same_type``: and the parts are of one class); the names of the parts copied."""
    copied = []
    for name in names:
        mine, theirs = getattr(system, name), getattr(previous, name, None)
        if not isinstance(theirs, nn.Module) or (same_type and type(theirs) is not type(mine)):
            continue
        source, target = theirs.state_dict(), mine.state_dict()
        if source.keys() == target.keys() and all(source[k].shape == target[k].shape for k in source):
            mine.load_state_dict(source)
            copied.append(name)
    return copied


FIELD_PARTS = ("field", "material", "background", "renderer")  # what a NeRF stage takes (the occupancy grid: renderer)


def take_field(system: Any, previous: Any, previous_cfg: Any, why: str, error: type[Exception] = ValueError) -> list[str]:
    """A NeRF stage's start: every part of ``FIELD_PARTS`` that matches (the field at least, else ``error`` saying
    ``why``); the names of the parts copied."""
    copied = copy_matching_parts(system, previous, FIELD_PARTS)
    if "field" not in copied:
        raise error(f"system.geometry_convert_from: the {previous_cfg.system_type} run's field does not match this run's "
                    f"({why})")
    return copied


def take_gaussians(system: Any, previous: Any) -> Any:
    """The system's Gaussians set to the previous stage's (copied); its Gaussian model, or None (nothing taken) when it
    has none."""
    theirs = getattr(previous, "gaussians", None)
    if theirs is None or not hasattr(theirs, "parameters_dict"):
        return None
    system.gaussians.set_parameters({k: v.detach() for k, v in theirs.parameters_dict().items()})
    return theirs
