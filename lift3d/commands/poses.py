"""``lift3d poses PHOTOS_OR_VIDEO [--matcher M] [--force]``: camera poses by structure from motion, alone."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = ("recover camera poses of a folder of photos or a video by structure from motion (pycolmap); the COLMAP "
        "model goes beside the photos (sparse/0) and `lift3d reconstruct` reuses it")


MATCHERS = ("auto", "exhaustive", "sequential")  # lift3d.data.sfm.MATCHERS, here so --help imports no torch


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("path", help="a folder of photos (or with an images/ folder of photos), or a video file")
    parser.add_argument("--matcher", choices=MATCHERS, default="auto",
                        help="exhaustive (every pair; small sets), sequential (neighbors; video) or auto (default)")
    parser.add_argument("--frames", type=int, default=0, metavar="N",
                        help="video: how many frames to take (default: 100 with a CUDA GPU, 40 without)")
    parser.add_argument("--force", action="store_true", help="run again even if the folder already has poses")


def run(args: argparse.Namespace) -> int:
    from lift3d.data.capture import SceneFormatError
    from lift3d.data.sfm import SfmOptions, has_poses, photo_folder, prepare_capture

    if args.frames < 0:
        raise SceneFormatError(f"--frames must be a number of video frames >= 0 (0: the default), got {args.frames}: "
                               "e.g. --frames 60")
    path = Path(args.path).expanduser().resolve()
    if not path.exists():
        raise SceneFormatError(f"{path} does not exist: give a folder of photos or a video file")
    options = SfmOptions(matcher=args.matcher, force=args.force)
    scene = prepare_capture(path, options, args.frames)
    if not options.stage_seconds:
        if has_poses(scene):
            print(f"lift3d: {scene} already has poses (pass --force to recover them again)")
            return 0
        found = "no photos" if photo_folder(scene) is None else "photos lift3d could not use"
        raise SceneFormatError(f"{scene} holds {found}: give a folder of .jpg/.png photos (or one with images/) or a video")
    times = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in options.stage_seconds.items())
    print(f"lift3d: poses written to {scene / 'sparse' / '0'} ({times}); next: lift3d reconstruct {scene}")
    return 0
