"""A video file: its sharpest evenly spaced frames (``lift3d.data.video``) are posed by structure from motion."""

from __future__ import annotations

from lift3d.data.formats import CaptureFormat, register_format

VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm")

FORMAT = register_format(CaptureFormat(
    name="video",
    description="a video",
    detect=lambda path: path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES,
    priority=95,
))
