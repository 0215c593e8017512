"""Frames from a video for structure from motion: evenly spaced through the clip, the sharpest of each stretch.

The clip is cut into as many equal stretches as frames are wanted; from each, a few evenly spaced
candidates are scored by the variance of their Laplacian (a standard focus measure: motion blur lowers
it) and the sharpest is kept, so blurry frames are dropped without leaving gaps in the path.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from lift3d.data.capture import SceneFormatError
from lift3d.limits import VIDEO_FRAME_PIXELS, VIDEO_FRAMES

log = logging.getLogger("lift3d.sfm")
CANDIDATES_PER_FRAME = 4  # frames scored per stretch of the clip


def frames_folder(video: Path) -> Path:
    """Where a video's frames go: a folder named after the clip, beside it (``clip.mp4`` -> ``clip/``)."""
    return video.with_suffix("")


def default_frame_count() -> int:
    """Frames to take from a clip: fewer on a CPU, where SfM and training cost more per frame."""
    import torch

    return 100 if torch.cuda.is_available() else 40


def sharpness(rgb: np.ndarray) -> float:
    """Variance of the Laplacian of the gray image (higher is sharper), on at most 640 px a side."""
    import cv2

    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    scale = 640 / max(gray.shape)
    if scale < 1:
        gray = cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    return float(cv2.Laplacian(gray, cv2.CV_64F).var())


def _frame_count(reader) -> int:
    try:
        return int(reader.count_frames())
    except Exception:  # some containers do not say; fall back to reading through
        return sum(1 for _ in reader)


def ffmpeg_reason(error: BaseException) -> str:
    """The line of an imageio-ffmpeg error that says what is wrong (ffmpeg appends its build banner and log to it)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    said = [line for line in lines if "error" in line.lower() or "invalid" in line.lower() or "no such" in line.lower()]
    return (said[-1] if said else lines[0] if lines else type(error).__name__)[:300]


def check_video_size(video: Path, meta: dict) -> None:
    """Refuse a video whose frames (its container's size) or frame count (its duration x frame rate) are over
    ``VIDEO_FRAME_PIXELS`` / ``VIDEO_FRAMES``, from its header, before a frame is decoded."""
    width, height = (int(v) for v in (meta.get("size") or (0, 0))[:2])
    fix = "cut it shorter, or scale it down (e.g. ffmpeg -i IN -vf scale=1920:-2 OUT.mp4)"
    VIDEO_FRAME_PIXELS.check(str(video), width * height, SceneFormatError, fix, detail=f"frames of {width} x {height} px")
    duration, fps = float(meta.get("duration") or 0.0), float(meta.get("fps") or 0.0)
    if math.isfinite(duration * fps):
        VIDEO_FRAMES.check(str(video), round(duration * fps), SceneFormatError, fix,
                           detail=f"{duration:.0f} s at {fps:g} frames a second")


def extract_frames(video: Path, out: Path, n_frames: int = 0) -> list[Path]:
    """Write ``n_frames`` (0: ``default_frame_count()``) sharp, evenly spaced frames of ``video`` to ``out`` as JPGs."""
    import imageio.v2 as imageio

    n_frames = n_frames or default_frame_count()
    try:
        reader = imageio.get_reader(str(video), "ffmpeg")
        check_video_size(video, reader.get_meta_data())
        total = _frame_count(reader)
        reader.close()
    except SceneFormatError:
        raise
    except Exception as error:
        raise SceneFormatError(f"cannot read the video {video}: {ffmpeg_reason(error)}; give a video ffmpeg can play "
                               "(.mp4, .mov) or a folder of photos") from None
    if total < 2:
        raise SceneFormatError(f"{video} has {total} frame(s): a video for structure from motion needs many")
    n_frames = min(n_frames, total)
    bounds = np.linspace(0, total, n_frames + 1)
    wanted: dict[int, int] = {}  # frame index -> stretch
    for stretch in range(n_frames):
        lo, hi = int(bounds[stretch]), max(int(bounds[stretch]) + 1, int(bounds[stretch + 1]))
        for index in np.linspace(lo, hi - 1, min(CANDIDATES_PER_FRAME, hi - lo)).round().astype(int):
            wanted[int(index)] = stretch
    best: dict[int, tuple[float, np.ndarray]] = {}
    reader = imageio.get_reader(str(video), "ffmpeg")
    for index, frame in enumerate(reader):
        if index in wanted:
            score, stretch = sharpness(frame), wanted[index]
            if stretch not in best or score > best[stretch][0]:
                best[stretch] = (score, np.ascontiguousarray(frame[..., :3]))
        if index >= max(wanted):
            break
    reader.close()
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    from PIL import Image

    for stretch in sorted(best):
        path = out / f"frame_{stretch:05d}.jpg"
        Image.fromarray(best[stretch][1]).save(path, quality=95)
        paths.append(path)
    log.info("took %d of %d frames of %s (the sharpest of %d candidates per stretch) into %s", len(paths), total, video,
             CANDIDATES_PER_FRAME, out)
    return paths
