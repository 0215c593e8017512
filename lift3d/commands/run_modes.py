"""``lift3d train|validate|test CONFIG [overrides...]``."""

from __future__ import annotations

import argparse

from lift3d.commands.common import (
    add_config_arguments,
    add_viewer_arguments,
    load_experiment,
    training_callbacks,
    viewer_overrides,
)

HELP = {
    "train": "train a config (resume with --resume CKPT)",
    "validate": "render the validation views of a checkpoint and score them",
    "test": "render the test views (orbit video) of a checkpoint",
}


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_config_arguments(parser)
    if name == "train":
        add_viewer_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from lift3d.runs.runner import run_experiment

    cfg, paths, overrides = load_experiment(args, viewer_overrides(args))
    run_dir = run_experiment(args.command, cfg, paths, overrides, callbacks=training_callbacks)
    print(f"lift3d: results in {run_dir}")
    return 0
