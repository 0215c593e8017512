"""``lift3d export CONFIG --resume CKPT [--format ...] [overrides...]``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from lift3d.commands.common import add_config_arguments, load_experiment

log = logging.getLogger("lift3d.export")

HELP = ("export a checkpoint's asset (meshes, Gaussian .ply, video, web page) into the run's save/, or convert a 3DGS "
        ".ply, .splat, .spz, .sog, .ksplat, KHR_gaussian_splatting .glb or streamed SOG (lod-meta.json or its folder) from "
        "any tool (written beside it, named after it and its format)")
GAUSSIAN_FILE_FORMATS = ["glb", "splat"]  # what `lift3d export MODEL.ply` writes without --format


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    add_config_arguments(parser)
    parser.add_argument("--format", nargs="+", default=None, metavar="FMT",
                        help="formats to write (default: the recipe's own list; `lift3d info` lists every format)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace files that lift3d did not write (by default an export never replaces a file that is "
                             "not lift3d's own earlier export, as recorded in the folder's .lift3d-exports.json)")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def run(args: argparse.Namespace) -> int:
    from lift3d.api.exporting import raise_failed_exports
    from lift3d.runs.run_dirs import export_device, load_system, make_run_dir, run_dir_of_checkpoint
    from lift3d.saving import OutputSaver

    if args.format:  # --format takes every later word: hand key=value overrides back to the config
        args.config = args.config + [item for item in args.format if "=" in item]
        args.format = [item for item in args.format if "=" not in item] or None
    gaussian_file = _gaussian_file(args.config)
    if gaussian_file is not None:
        from lift3d.api.exporting import export_gaussian_file

        written = export_gaussian_file(gaussian_file, args.format or GAUSSIAN_FILE_FORMATS,
                                       [item for item in args.config if "=" in item], overwrite=args.overwrite)
        raise_failed_exports()
        print(f"lift3d: exported {len(written)} file(s) beside {gaussian_file}:")
        for path in written:
            print(f"  {path}  {_size(path.stat().st_size)}")
        return 0
    cfg, _, _ = load_experiment(args)
    run_dir = run_dir_of_checkpoint(cfg.resume) or make_run_dir(cfg)
    system = load_system(cfg, cfg.resume, export_device())
    written = system.export(OutputSaver(run_dir / "save", overwrite=args.overwrite), args.format)
    raise_failed_exports()
    on = f" on {system.device.type.upper()}" if system.device.type != "cpu" else ""
    print(f"lift3d: exported {len(written)} file(s){on} into {run_dir / 'save'}:")
    for path in written:
        print(f"  {path}  {_size(path.stat().st_size)}")
    return 0


def _gaussian_file(items: list[str]) -> Path | None:
    """The one positional item when it is a Gaussian file (a suffix a registered Gaussian codec reads, or a streamed
    SOG's folder) rather than a config or run folder."""
    from lift3d.gaussians.formats.files import reader_suffixes
    from lift3d.gaussians.formats.sog_lod import bundle_meta

    paths = [Path(item) for item in items if "=" not in item]
    if len(paths) == 1 and paths[0].is_dir() and bundle_meta(paths[0]) is not None:  # a streamed SOG's folder
        return bundle_meta(paths[0])
    if len(paths) == 1 and paths[0].suffix.lower() in reader_suffixes():
        if not paths[0].is_file():
            raise FileNotFoundError(f"Gaussian file not found: {paths[0]}")
        return paths[0]
    return None
