"""``lift3d export CONFIG --resume CKPT [--format ...] [overrides...]``."""

from __future__ import annotations

import argparse

from lift3d.commands.common import add_config_arguments, load_experiment

HELP = "export a checkpoint's asset (meshes, Gaussian .ply, video) into the trial's save/"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_config_arguments(parser)
    parser.add_argument("--format", nargs="+", default=None, metavar="FMT",
                        help="formats to write (default: the recipe's own list)")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def run(args: argparse.Namespace) -> int:
    from lift3d.runner import load_system, make_trial_dir, trial_dir_of_checkpoint
    from lift3d.saving import OutputSaver

    if args.format:  # --format takes every later word: hand key=value overrides back to the config
        args.config = args.config + [item for item in args.format if "=" in item]
        args.format = [item for item in args.format if "=" not in item] or None
    cfg, _, _ = load_experiment(args)
    trial = trial_dir_of_checkpoint(cfg.resume) or make_trial_dir(cfg)
    system = load_system(cfg, cfg.resume)
    written = system.export(OutputSaver(trial / "save"), args.format)
    print(f"lift3d: exported {len(written)} file(s) into {trial / 'save'}:")
    for path in written:
        print(f"  {path}  {_size(path.stat().st_size)}")
    return 0
