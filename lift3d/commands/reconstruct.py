"""``lift3d reconstruct [PATH] [--method METHOD] [overrides...]``: photos -> 3D in one command (``lift3d.reconstruct``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from lift3d.commands.poses import POSE_METHODS
from lift3d.method_table import PHOTOS, default_method, method_names, methods


def _help() -> str:
    from lift3d.commands.tables import capture_format_lists  # the format table, read without importing torch

    posed, unposed = capture_format_lists()
    return (f"reconstruct a scene from photos: a posed folder ({posed}), {unposed} "
            "(poses by structure from motion); with no path, the built-in sample scene")


HELP = _help()


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    from lift3d.commands.common import add_device_arguments, add_viewer_arguments

    parser.add_argument("config", nargs="*", metavar="[PATH] [KEY=VALUE ...]",
                        help="scene folder, photo folder or video, then config overrides such as trainer.max_steps=7000")
    parser.add_argument("--method", choices=method_names(PHOTOS), default=default_method(PHOTOS).name,
                        help="; ".join(f"{m.name}: {m.description}" for m in methods(PHOTOS))
                        + f" (default: {default_method(PHOTOS).name})")
    parser.add_argument("--poses", choices=POSE_METHODS, default="auto",
                        help="photos without poses: sfm (structure from motion), vggt (predicted; needs its weights: "
                             "lift3d poses --help) or auto (default: vggt where its weights are, else sfm)")
    add_device_arguments(parser)
    add_viewer_arguments(parser)


def summary(run) -> list[str]:
    """What a finished reconstruction prints: where it went, its held-out scores, its Gaussians and videos."""
    lines = [f"lift3d: results in {run.path}"]
    val = run.metrics.get("val")
    if val:
        lines.append(f"  val PSNR {val['psnr']:.2f} dB, SSIM {val['ssim']:.4f} over {val['views']} views "
                     f"at step {val['step']}  ({run.path / 'save' / 'metrics.json'})")
    save = Path(run.path) / "save"
    for pattern in ("*.ply", "*.mp4"):
        lines += [f"  {path}" for path in sorted(save.glob(pattern))]
    return lines


def run(args: argparse.Namespace) -> int:
    from lift3d.api import reconstruct
    from lift3d.commands.common import training_callbacks, viewer_overrides
    from lift3d.data.capture import SceneFormatError

    paths = [item for item in args.config if "=" not in item]
    overrides = [item for item in args.config if "=" in item]
    if len(paths) > 1:
        raise SceneFormatError(f"give one scene folder, got {len(paths)}: {' '.join(paths)} (overrides need key=value)")
    result = reconstruct(paths[0] if paths else None, args.method, gpus=args.gpus, nodes=args.nodes,
                         overrides=[*viewer_overrides(args), *overrides], callbacks=training_callbacks,
                         poses=args.poses)
    print("\n".join(summary(result)))
    return 0
