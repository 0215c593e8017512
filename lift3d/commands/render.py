"""``lift3d render RUN_OR_FILE --path path.json [--out video.mp4]``: a camera path recorded in the viewer, as a video."""

from __future__ import annotations

import argparse
from pathlib import Path

from lift3d.commands.common import add_allow_imports_argument
from lift3d.commands.view import SOURCE_HELP

HELP = "render a camera path recorded in the viewer (path.json) from a run, a Gaussian file or a mesh (as lift3d view) to an .mp4"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("source", metavar="RUN_OR_FILE", help=SOURCE_HELP)
    parser.add_argument("--path", required=True, metavar="PATH_JSON", help="the camera path (the viewer's Camera path > Save)")
    parser.add_argument("--out", default=None, metavar="VIDEO",
                        help="the video to write, .mp4 or .gif (default: beside path.json)")
    parser.add_argument("--width", type=int, default=None, help="frame width (default: the path's)")
    parser.add_argument("--height", type=int, default=None, help="frame height (default: the path's)")
    parser.add_argument("--device", default=None, help="where to render: cuda or cpu (default: cuda when available)")
    add_allow_imports_argument(parser)


def render_camera_path(source: str | Path, path_json: str | Path, out: str | Path | None = None, width: int | None = None,
                       height: int | None = None, device: str | None = None, allow_imports: bool = False) -> tuple[Path, int]:
    """Render the path's frames from the model at ``source`` and write the video; (its path, the frame count)."""
    import torch

    from lift3d.config import ConfigError
    from lift3d.export.video import check_video_size, render_frames
    from lift3d.saving import OutputSaver
    from lift3d.viewer.models import load_view_model
    from lift3d.viewer.path import load_camera_path, path_cameras

    camera_path = load_camera_path(path_json)
    # every frame is rendered whole: a 100000-pixel side would run out of memory (or time) before the first one
    check_video_size(camera_path.width if width is None else width, camera_path.height if height is None else height,
                     f"the width in {path_json}" if width is None else "--width",
                     f"the height in {path_json}" if height is None else "--height", ("--width 1920", "--height 1080"))
    target = Path(out) if out else Path(path_json).with_suffix(".mp4")
    if target.suffix.lower() not in (".mp4", ".gif"):
        raise ConfigError(f"--out {target}: write an .mp4 or a .gif")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_view_model(source, device, allow_imports=allow_imports)
    cameras = path_cameras(camera_path, width, height)
    frames = render_frames(model.render_fn, cameras.to(device))
    written = OutputSaver(target.parent).video(target.name, frames, fps=round(camera_path.fps))
    return written, len(frames)


def run(args: argparse.Namespace) -> int:
    written, frames = render_camera_path(args.source, args.path, args.out, args.width, args.height, args.device,
                                         allow_imports=args.allow_imports)
    print(f"lift3d: rendered {frames} frames to {written}")
    return 0
