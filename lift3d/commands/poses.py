"""``lift3d poses PHOTOS_OR_VIDEO [--method auto|sfm|vggt] [--force]``: camera poses alone, by structure from motion or
predicted by VGGT."""

from __future__ import annotations

import argparse
from pathlib import Path

# as lift3d.data.sfm, lift3d.data.learned_poses and lift3d.generators.vggt_files / vggt_images name them, here so
# --help imports no torch
MATCHERS = ("auto", "exhaustive", "sequential")
POSE_METHODS = ("auto", "sfm", "vggt")
ENV_VAR, MODES, TARGET = "LIFT3D_VGGT_WEIGHTS", ("crop", "pad"), 518
HELP = ("recover camera poses of a folder of photos or a video, by structure from motion (pycolmap) or predicted by VGGT "
        "in seconds; the COLMAP model goes beside the photos (sparse/0) and `lift3d reconstruct` reuses it")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("path", help="a folder of photos (or with an images/ folder of photos), or a video file")
    parser.add_argument("--method", choices=POSE_METHODS, default="auto",
                        help="sfm: structure from motion (minutes on a CPU; needs overlap and texture); vggt: the VGGT "
                             "network predicts every camera and a depth map in one pass (seconds on a GPU; needs its "
                             "weights); auto (default): vggt when its weights are on this machine, else sfm")
    parser.add_argument("--force", action="store_true", help="run again even if the folder already has poses")
    parser.add_argument("--frames", type=int, default=0, metavar="N",
                        help="video: how many frames to take (default: 100 with a CUDA GPU, 40 without)")
    sfm = parser.add_argument_group("structure from motion")
    sfm.add_argument("--matcher", choices=MATCHERS, default="auto",
                     help="exhaustive (every pair; small sets), sequential (neighbors; video) or auto (default)")
    vggt = parser.add_argument_group("VGGT")
    vggt.add_argument("--vggt-weights", metavar="PATH", default=None,
                      help=f"model.safetensors or model.pt of facebook/VGGT-1B (CC-BY-NC-4.0, non-commercial) or "
                           f"facebook/VGGT-1B-Commercial (commercial use allowed), or their folder (default: ${ENV_VAR}, "
                           "else the local Hugging Face cache; nothing is downloaded)")
    vggt.add_argument("--points", type=int, default=0, metavar="N",
                      help="points in the cloud the Gaussians start from (default: 100000 with a CUDA GPU, 20000 without)")
    vggt.add_argument("--min-confidence", type=float, default=5.0, metavar="C",
                      help="depth pixels need at least this confidence to become points (default: 5, as VGGT's demo)")
    vggt.add_argument("--resize", choices=MODES, default="crop",
                      help=f"crop (default): photos {TARGET} px wide, tall ones center-cropped; pad: the longer side "
                           f"{TARGET} px, padded square (nothing cut off)")
    vggt.add_argument("--vggt-size", type=int, default=TARGET, metavar="PIXELS",
                      help=f"VGGT's input width (a multiple of 14; the released model is trained at {TARGET})")


def run(args: argparse.Namespace) -> int:
    from lift3d.data.capture import SceneFormatError
    from lift3d.data.formats.photos import photo_folder
    from lift3d.data.learned_poses import LearnedPoseOptions
    from lift3d.data.sfm import SfmOptions, has_poses
    from lift3d.generators.vggt import prepare_with_poses

    if args.frames < 0:
        raise SceneFormatError(f"--frames must be a number of video frames >= 0 (0: the default), got {args.frames}: "
                               "e.g. --frames 60")
    if args.points < 0:
        raise SceneFormatError(f"--points must be a number of points >= 0 (0: the default), got {args.points}: "
                               "e.g. --points 50000")
    path = Path(args.path).expanduser().resolve()
    if not path.exists():
        raise SceneFormatError(f"{path} does not exist: give a folder of photos or a video file")
    sfm = SfmOptions(matcher=args.matcher, force=args.force)
    learned = LearnedPoseOptions(min_confidence=args.min_confidence, points=args.points, force=args.force)
    scene = prepare_with_poses(path, args.method, args.vggt_weights, args.frames, sfm, learned, mode=args.resize,
                               resolution=args.vggt_size)
    seconds = sfm.stage_seconds or learned.stage_seconds
    if not seconds:
        if has_poses(scene):
            print(f"lift3d: {scene} already has poses (pass --force to recover them again)")
            return 0
        found = "no photos" if photo_folder(scene) is None else "photos lift3d could not use"
        raise SceneFormatError(f"{scene} holds {found}: give a folder of .jpg/.png photos (or one with images/) or a video")
    times = ", ".join(f"{stage} {value:.1f} s" for stage, value in seconds.items())
    how = "structure from motion" if sfm.stage_seconds else "VGGT"
    print(f"lift3d: poses written to {scene / 'sparse' / '0'} by {how} ({times}); next: lift3d reconstruct {scene}")
    return 0
