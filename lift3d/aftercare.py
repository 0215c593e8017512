"""Steps after training that may fail on their own (test renders, videos, each export): each one that fails
logs one warning that names what is missing and how to install it, the others still run, and the run ends
"trained, with problems" (``EXIT_TRAINED_WITH_PROBLEMS``) instead of as a failed run. A finished training
run is never undone by a writer.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("lift3d")
T = TypeVar("T")

EXIT_TRAINED_WITH_PROBLEMS = 3  # the command's exit code when training finished but a post-training step failed
_problems: list[str] = []


class WriterUnavailable(RuntimeError):
    """A writer whose backend is not installed; the message names the package and the install command."""


def reset() -> None:
    """Forget the problems of an earlier run (one command may run several)."""
    _problems.clear()


def problems() -> list[str]:
    """What failed after training, one line each, in order."""
    return list(_problems)


def describe(error: BaseException) -> str:
    """One line for a failed step: the writer's own message, or the exception's first line."""
    if isinstance(error, (WriterUnavailable, ImportError)):
        return str(error).strip().splitlines()[0]
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def attempt(what: str, step: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """``step(*args, **kwargs)``, or None with one warning if it raises (Ctrl-C still stops the command)."""
    try:
        return step(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except Exception as error:  # noqa: BLE001  (a writer may fail in any way; the run's result stands)
        message = f"{what} failed: {describe(error)}"
        log.warning(message)
        log.debug("%s", what, exc_info=True)
        _problems.append(message)
        return None


def require_ffmpeg() -> None:
    """Raise ``WriterUnavailable`` unless imageio can write H.264 .mp4 files (imageio-ffmpeg present)."""
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        raise WriterUnavailable("writing .mp4 needs imageio's FFMPEG plugin: pip install imageio-ffmpeg "
                                "(or ask for gif instead)")


def require_webp() -> None:
    """Raise ``WriterUnavailable`` unless Pillow can encode WebP (the images of a .sog file)."""
    from PIL import features

    if not features.check("webp"):
        raise WriterUnavailable("writing .sog needs Pillow built with WebP: pip install --force-reinstall pillow "
                                "(the PyPI wheels include it)")


def writer_status() -> dict[str, str]:
    """Which writers can run here: name -> "ok" or what is missing and how to install it (``lift3d info``)."""
    checks = {
        "mp4": (require_ffmpeg, None),
        "gif, png": ("PIL", "pip install pillow"),
        "glb, obj (meshes)": ("trimesh", "pip install trimesh"),
        "textures (UV atlas)": ("xatlas", "pip install xatlas"),
        "marching cubes": ("mcubes", "pip install PyMCubes"),
        "3dgs-ply": ("plyfile", "pip install plyfile"),
        "sog (lossless WebP)": (require_webp, None),
    }
    status = {}
    for name, (check, install) in checks.items():
        if callable(check):
            try:
                check()
                status[name] = "ok"
            except WriterUnavailable as error:
                status[name] = str(error)
        else:
            status[name] = "ok" if importlib.util.find_spec(check) is not None else f"missing: {install}"
    return status
