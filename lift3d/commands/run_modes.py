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
    "train": "train a recipe (by name: lift3d train --list) or a config file (resume with --resume CKPT)",
    "validate": "render the validation views of a checkpoint and score them",
    "test": "render the test views (orbit video) of a checkpoint",
}


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_config_arguments(parser, required=name != "train")
    if name == "train":
        parser.add_argument("--list", action="store_true",
                            help="list the recipes that ship with lift3d and what each needs (a CUDA GPU, model weights)")
        add_viewer_arguments(parser)


def list_recipes() -> int:
    from lift3d.recipes import recipe_table

    print("recipes (lift3d train NAME [KEY=VALUE ...]; runs on; model weights it loads):")
    print("\n".join(recipe_table()))
    return 0


def run(args: argparse.Namespace) -> int:
    if getattr(args, "list", False):
        return list_recipes()
    cfg, paths, overrides = load_experiment(args, viewer_overrides(args))
    from lift3d.runs.runner import run_experiment

    run_dir = run_experiment(args.command, cfg, paths, overrides, callbacks=training_callbacks)
    print(f"lift3d: results in {run_dir}")
    return 0
