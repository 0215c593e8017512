"""Argument helpers shared by sub-commands."""

from __future__ import annotations

import argparse
from typing import Any


def add_config_arguments(parser: argparse.ArgumentParser, resume_required: bool = False) -> None:
    parser.add_argument("config", nargs="+", metavar="CONFIG_OR_OVERRIDE",
                        help="YAML config file(s), then dotlist overrides such as system.optimizer.args.lr=0.01")
    parser.add_argument("--resume", metavar="CKPT", required=resume_required,
                        help="checkpoint to resume from (train) or to load (validate, test, export)")
    parser.add_argument("--gpus", metavar="IDS", default=None,
                        help="comma-separated GPU ids, e.g. 0,1 (several GPUs train with DDP)")


def split_configs(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional items -> (YAML paths, key=value overrides)."""
    paths = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    return paths, overrides


def parse_gpus(text: str | None) -> Any:
    """``"0,1"`` -> [0, 1]; None keeps the config's devices."""
    if text is None:
        return None
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--gpus takes comma-separated GPU ids such as 0,1; got '{text}'") from None
    if not ids:
        raise ValueError("--gpus got no GPU ids")
    return ids


def load_experiment(args: argparse.Namespace, extra_overrides: list[str] | None = None) -> tuple[Any, list[str], list[str]]:
    """The experiment config from the positional items, --resume and --gpus."""
    from lift3d.config import ConfigError, load_config

    paths, overrides = split_configs(args.config)
    if not paths:
        raise ConfigError("no config file given: pass a YAML file, e.g. configs/reconstruct-gaussians.yaml")
    overrides = list(extra_overrides or []) + overrides
    if getattr(args, "resume", None):
        overrides.append(f"resume={args.resume}")
    gpus = parse_gpus(getattr(args, "gpus", None))
    if gpus is not None:
        overrides += [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu"]
    return load_config(*paths, overrides=overrides), paths, overrides
