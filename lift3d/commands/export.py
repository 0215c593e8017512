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
GAUSSIAN_FILE_SUFFIXES = (".ply", ".splat", ".spz", ".sog", ".glb")  # positional files read as Gaussians (and READERS')
GAUSSIAN_FILE_FORMATS = ["glb", "splat"]  # what `lift3d export MODEL.ply` writes without --format


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


class ExportFailedError(RuntimeError):
    """An export asked for on the command line that could not be written (the writer's own reason, one line)."""


def raise_failed_exports() -> None:
    """``lift3d export`` exists to write files: a format that failed (each one fails on its own, with a warning, see
    ``lift3d.aftercare``) fails the command, with every reason on one line."""
    from lift3d import aftercare

    failed = aftercare.problems()
    if failed:
        aftercare.reset()
        full = any("No space left" in line or "Disk quota" in line for line in failed)
        fix = ("free some space (or export elsewhere: copy the input or the run to a disk with space)" if full else
               "fix the cause above and run lift3d export again; the checkpoint is untouched")
        raise ExportFailedError(f"{'; '.join(failed)}: {fix}")


def run(args: argparse.Namespace) -> int:
    from lift3d.runs.run_dirs import load_system, make_run_dir, run_dir_of_checkpoint
    from lift3d.saving import OutputSaver

    if args.format:  # --format takes every later word: hand key=value overrides back to the config
        args.config = args.config + [item for item in args.format if "=" in item]
        args.format = [item for item in args.format if "=" not in item] or None
    gaussian_file = _gaussian_file(args.config)
    if gaussian_file is not None:
        written = export_gaussian_file(gaussian_file, args.format or GAUSSIAN_FILE_FORMATS,
                                       [item for item in args.config if "=" in item])
        raise_failed_exports()
        print(f"lift3d: exported {len(written)} file(s) beside {gaussian_file}:")
        for path in written:
            print(f"  {path}  {_size(path.stat().st_size)}")
        return 0
    cfg, _, _ = load_experiment(args)
    run_dir = run_dir_of_checkpoint(cfg.resume) or make_run_dir(cfg)
    system = load_system(cfg, cfg.resume)
    written = system.export(OutputSaver(run_dir / "save"), args.format)
    raise_failed_exports()
    print(f"lift3d: exported {len(written)} file(s) into {run_dir / 'save'}:")
    for path in written:
        print(f"  {path}  {_size(path.stat().st_size)}")
    return 0


def _gaussian_file(items: list[str]) -> Path | None:
    """The one positional item when it is a Gaussian file (GAUSSIAN_FILE_SUFFIXES) rather than a config or run folder."""
    from lift3d.gaussians.formats.files import READERS
    from lift3d.gaussians.formats.sog_lod import bundle_meta

    paths = [Path(item) for item in items if "=" not in item]
    if len(paths) == 1 and paths[0].is_dir() and bundle_meta(paths[0]) is not None:  # a streamed SOG's folder
        return bundle_meta(paths[0])
    if len(paths) == 1 and paths[0].suffix.lower() in (*GAUSSIAN_FILE_SUFFIXES, *READERS):
        if not paths[0].is_file():
            raise FileNotFoundError(f"Gaussian file not found: {paths[0]}")
        return paths[0]
    return None


def export_gaussian_file(path: Path, formats: list[str], overrides: list[str]) -> list[Path]:
    """Convert or mesh a Gaussian file made by any tool (3DGS .ply, .splat, .spz, .sog, KHR_gaussian_splatting .glb):
    its Gaussians in a reconstruct-gaussians system (every attribute as stored), exported through the one export
    table beside the file, named after it and its format (``lift3d.export.naming``: ``model.sog`` ->
    ``model-sog.splat``), so no export replaces the file, another conversion, or a run's own exports."""
    from lift3d.export.formats import ExportFormatError, export_formats
    from lift3d.export.naming import FILE_ENDINGS, converted_stem, export_name
    from lift3d.render.splats.sh import degree_of
    from lift3d.saving import OutputSaver
    from lift3d.systems.gaussian_files import gaussian_file_system

    source = path.parent if path.suffix.lower() == ".json" else path  # a SOG's meta JSON: named after its folder, beside it
    stems = [item.split("=", 1)[1] for item in overrides if item.startswith("system.export.stem=")]
    stem = stems[-1] if stems and stems[-1] else converted_stem(source)
    for fmt in formats:
        fmt = str(fmt).lower().lstrip(".")
        if fmt in FILE_ENDINGS and (source.parent / export_name(stem, fmt)).resolve() == path.resolve():
            raise ExportFormatError(f"exporting {path} as {fmt} would overwrite it: pick another name with "
                                    "system.export.stem=NAME")
    system, params = gaussian_file_system(path, overrides)
    log.info("read %d Gaussians (SH degree %d) from %s", len(params["means"]), degree_of(params["shN"].shape[1] + 1), path)
    sources = system.export_sources()
    sources.antialiased = getattr(system.renderer.cfg, "rasterize_mode", "classic") == "antialiased"
    sources.gaussian_axes = "ply"  # the file's own axes, not lift3d's world: converted as other tools convert them
    return export_formats(OutputSaver(source.parent), formats, system.cfg.export, sources, stem=stem)
