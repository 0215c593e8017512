"""``lift3d render RUN_OR_FILE (--orbit | --path-through-cameras | --path path.json) [--out video.mp4]``: a video of a
model along a camera path: a full turn around it, a smooth path through its training cameras, or a path recorded in
the viewer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lift3d.commands.common import add_allow_imports_argument
from lift3d.commands.view import SOURCE_HELP

HELP = ("render a video of a run, a Gaussian file or a mesh (as lift3d view opens them) along a camera path: a turn around "
        "it (--orbit), through its training cameras (--path-through-cameras) or recorded in the viewer (--path)")
DEFAULT_FRAMES, DEFAULT_FPS = 120, 30  # --orbit and --path-through-cameras: 4 s at 30 frames per second
ORBIT_SIZE = 512  # --orbit's default frame: 512 x 512
MAX_SIDE = 960  # --path-through-cameras' default frame: the photos' aspect, at most this many pixels a side


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("source", metavar="RUN_OR_FILE", help=SOURCE_HELP)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--orbit", action="store_true", help="a full turn around the model, from where the viewer starts")
    which.add_argument("--path-through-cameras", action="store_true",
                       help="a smooth path through the run's training cameras (runs of posed photos)")
    which.add_argument("--path", metavar="PATH_JSON", help="a camera path recorded in the viewer (Camera path > Save)")
    parser.add_argument("--out", default=None, metavar="VIDEO",
                        help="the video to write, .mp4 or .gif (default: beside path.json, or RUN/save/render-orbit.mp4, "
                             "RUN/save/render-cameras.mp4; beside a file for a file)")
    parser.add_argument("--frames", type=int, default=None, metavar="N",
                        help=f"frames of --orbit or --path-through-cameras (default {DEFAULT_FRAMES})")
    parser.add_argument("--fps", type=int, default=None, help=f"frames per second (default: the path's, else {DEFAULT_FPS})")
    parser.add_argument("--elevation", type=float, default=None, metavar="DEG",
                        help="--orbit: camera elevation above the horizon, degrees (default: the viewer's start camera's)")
    parser.add_argument("--width", type=int, default=None,
                        help=f"frame width (default: the path's; {ORBIT_SIZE} for --orbit; the photos' for the cameras)")
    parser.add_argument("--height", type=int, default=None, help="frame height (default: as --width)")
    parser.add_argument("--device", default=None, help="where to render: cuda or cpu (default: cuda when available)")
    add_allow_imports_argument(parser)


def _positive(value: int | None, flag: str, example: str) -> None:
    from lift3d.config import ConfigError

    if value is not None and value < 1:
        raise ConfigError(f"{flag} must be a positive number, got {value}: e.g. {flag} {example}")


def default_out(model: Any, source: str | Path, kind: str) -> Path:
    """Where a video goes without --out: a run's save/ (``render-<kind>.mp4``), beside a file (``<stem>-<kind>.mp4``)."""
    path = Path(source).expanduser()
    if path.is_file() and path.suffix != ".ckpt":
        return path.with_name(f"{path.stem}-{kind}.mp4")
    return Path(model.folder) / "save" / f"render-{kind}.mp4"


def model_home(model: Any) -> Any:
    """Where the viewer's camera starts for ``model`` (a file's framing, behind a run's first training camera), else a
    camera framing the run's content points (text-to-3D runs), else None (lift3d's default view)."""
    from lift3d.framing import framing_camera
    from lift3d.viewer.models import home_camera

    home = model.home or home_camera(model.training_views)
    if home is None and model.system is not None and hasattr(model.system, "export_sources"):
        try:
            points = model.system.export_sources().content_points
            home = framing_camera(points().detach().cpu()) if points is not None else None
        except Exception:  # noqa: BLE001  (a system with nothing to frame: lift3d's default view)
            home = None
    return home


def path_through_training_cameras(model: Any, frames: int, width: int | None, height: int | None) -> Any:
    """The cameras of ``--path-through-cameras`` (``camera_path_through``: the test video's, ``lift3d.camera_paths``,
    where this lift3d has it, else the viewer's stand-in), at the photos' aspect and at most MAX_SIDE pixels a side
    unless --width / --height say otherwise."""
    from lift3d.config import ConfigError

    try:
        from lift3d.camera_paths import camera_path_through  # type: ignore[import-not-found]
    except ImportError:
        from lift3d.viewer.path import camera_path_through

    views = model.training_views
    if views is None:
        raise ConfigError(f"{model.name} has no training cameras (only runs of posed photos do): use --orbit, or a path "
                          "recorded in lift3d view with --path")
    cameras = camera_path_through(views.cameras, frames)
    if width and height:
        w, h = width, height
    elif width or height:
        scale = (width / cameras.width) if width else (height / cameras.height)  # type: ignore[operator]
        w, h = width or round(cameras.width * scale), height or round(cameras.height * scale)
    else:
        scale = min(1.0, MAX_SIDE / max(cameras.width, cameras.height))
        w, h = round(cameras.width * scale), round(cameras.height * scale)
    return cameras.resized(max(2, w - w % 2), max(2, h - h % 2))


def render_video(source: str | Path, mode: str, path_json: str | Path | None = None, out: str | Path | None = None,
                 frames: int | None = None, fps: int | None = None, width: int | None = None, height: int | None = None,
                 elevation_deg: float | None = None, device: str | None = None,
                 allow_imports: bool = False) -> tuple[Path, int]:
    """Render the model at ``source`` along ``mode``'s cameras (orbit, cameras, or path with ``path_json``) and write
    the video; (its path, the frame count)."""
    import torch

    from lift3d.config import ConfigError
    from lift3d.export.video import check_video_size, render_frames
    from lift3d.saving import OutputSaver
    from lift3d.viewer.models import load_view_model
    from lift3d.viewer.path import load_camera_path, orbit_path, path_cameras

    for value, flag, example in ((frames, "--frames", "120"), (fps, "--fps", "30")):  # sizes: check_video_size
        _positive(value, flag, example)
    camera_path = load_camera_path(path_json) if mode == "path" else None
    if camera_path is not None:  # every frame is rendered whole: check the size before loading a large model
        check_video_size(camera_path.width if width is None else width, camera_path.height if height is None else height,
                         f"the width in {path_json}" if width is None else "--width",
                         f"the height in {path_json}" if height is None else "--height", ("--width 1920", "--height 1080"))
    elif width is not None or height is not None:
        check_video_size(width or height, height or width, "--width", "--height", ("--width 1920", "--height 1080"))
    if out is not None and Path(out).suffix.lower() not in (".mp4", ".gif"):
        raise ConfigError(f"--out {out}: write an .mp4 or a .gif")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_view_model(source, device, allow_imports=allow_imports)
    if camera_path is not None:
        cameras = path_cameras(camera_path, width, height)
        target = Path(out) if out else Path(path_json).with_suffix(".mp4")
        fps = fps or round(camera_path.fps)
    elif mode == "orbit":
        size = (width or height or ORBIT_SIZE, height or width or ORBIT_SIZE)
        cameras = orbit_path(model_home(model), frames or DEFAULT_FRAMES, size[0], size[1], elevation_deg=elevation_deg)
        target = Path(out) if out else default_out(model, source, "orbit")
    else:
        cameras = path_through_training_cameras(model, frames or DEFAULT_FRAMES, width, height)
        target = Path(out) if out else default_out(model, source, "cameras")
    check_video_size(cameras.width, cameras.height, "--width", "--height", ("--width 1920", "--height 1080"))
    rendered = render_frames(model.render_fn, cameras.to(device))
    written = OutputSaver(target.parent).video(target.name, rendered, fps=fps or DEFAULT_FPS)
    return written, len(rendered)


def render_camera_path(source: str | Path, path_json: str | Path, out: str | Path | None = None, width: int | None = None,
                       height: int | None = None, device: str | None = None, allow_imports: bool = False) -> tuple[Path, int]:
    """Render a recorded camera path (path.json) from the model at ``source``; (the video, the frame count)."""
    return render_video(source, "path", path_json, out, width=width, height=height, device=device,
                        allow_imports=allow_imports)


def run(args: argparse.Namespace) -> int:
    mode = "orbit" if args.orbit else "cameras" if args.path_through_cameras else "path"
    written, frames = render_video(args.source, mode, args.path, args.out, args.frames, args.fps, args.width, args.height,
                                   args.elevation, args.device, allow_imports=args.allow_imports)
    print(f"lift3d: rendered {frames} frames to {written}")
    return 0
