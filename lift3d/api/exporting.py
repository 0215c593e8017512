"""Exports of a finished run through the one export table (the same path ``lift3d export RUN`` takes)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lift3d.api.overrides import as_overrides

log = logging.getLogger("lift3d.export")


def export_run(run_dir: Path, formats: list[str] | None, overwrite: bool = False, settings: dict[str, Any] | None = None,
               allow_imports: bool = False) -> list[Path]:
    """Write ``formats`` (None: the recipe's own list) of a run's last checkpoint into its ``save/``; ``settings``:
    export config overrides by key (``target_faces=20000`` sets ``system.export.target_faces``). A format that cannot be
    written raises ``ExportFailedError`` naming it; the others are written."""
    from lift3d import aftercare
    from lift3d.config import ConfigError, load_config
    from lift3d.runs.run_dirs import export_device, load_system
    from lift3d.saving import OutputSaver

    checkpoint = run_dir / "ckpts" / "last.ckpt"
    if not checkpoint.is_file():
        raise ConfigError(f"{run_dir} has no checkpoint (ckpts/last.ckpt) to export: let the run finish, or resume it")
    overrides = as_overrides({f"system.export.{key}": value for key, value in (settings or {}).items()})
    cfg = load_config(run_dir / "configs" / "parsed.yaml", overrides=[*overrides, f"resume={checkpoint}"],
                      allow_imports=True if allow_imports else None)
    system = load_system(cfg, checkpoint, export_device())
    aftercare.reset()
    written = system.export(OutputSaver(run_dir / "save", overwrite=overwrite), formats)
    raise_failed_exports()
    return [Path(p) for p in written]


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
        foreign = any("ForeignFileError" in line for line in failed)
        fix = ("free some space (or export elsewhere: copy the input or the run to a disk with space)" if full else
               "the files in the way were left untouched" if foreign else
               "fix the cause above and run lift3d export again; the checkpoint is untouched")
        raise ExportFailedError(f"{'; '.join(failed)}: {fix}")


def export_gaussian_file(path: Path, formats: list[str], overrides: list[str], overwrite: bool = False) -> list[Path]:
    """Convert or mesh a Gaussian file made by any tool (3DGS .ply, .splat, .spz, .sog, KHR_gaussian_splatting .glb):
    its Gaussians in a reconstruct-gaussians system (every attribute as stored), exported through the one export
    table beside the file, named after it and its format (``lift3d.export.naming``: ``model.sog`` ->
    ``model-sog.splat``), so no export replaces the file, another conversion, or a run's own exports; nor, unless
    ``overwrite``, any file there that lift3d did not write (``OutputSaver.exporting``)."""
    from lift3d.export.formats import ExportFormatError, export_formats
    from lift3d.export.naming import converted_stem, export_name, file_endings
    from lift3d.saving import OutputSaver
    from lift3d.sh import degree_of
    from lift3d.systems.gaussian_files import gaussian_file_system

    source = path.parent if path.suffix.lower() == ".json" else path  # a SOG's meta JSON: named after its folder, beside it
    stems = [item.split("=", 1)[1] for item in overrides if item.startswith("system.export.stem=")]
    stem = stems[-1] if stems and stems[-1] else converted_stem(source)
    for fmt in formats:
        fmt = str(fmt).lower().lstrip(".")
        if fmt in file_endings() and (source.parent / export_name(stem, fmt)).resolve() == path.resolve():
            raise ExportFormatError(f"exporting {path} as {fmt} would overwrite it: pick another name with "
                                    "system.export.stem=NAME")
    system, params = gaussian_file_system(path, overrides)
    log.info("read %d Gaussians (SH degree %d) from %s", len(params["means"]), degree_of(params["shN"].shape[1] + 1), path)
    sources = system.export_sources()
    sources.antialiased = getattr(system.renderer.cfg, "rasterize_mode", "classic") == "antialiased"
    sources.gaussian_axes = "ply"  # the file's own axes, not lift3d's world: converted as other tools convert them
    saver = OutputSaver(source.parent, overwrite=overwrite)
    with saver.exporting():
        return export_formats(saver, formats, system.cfg.export, sources, stem=stem)
