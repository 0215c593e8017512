"""How large an input lift3d reads: every reader checks its file against one of these limits BEFORE it decodes or
allocates, so a broken or hostile file (a PNG header claiming 100,000 x 100,000 pixels, a gzip bomb, a header
counting billions of Gaussians) is refused in one line that names the file, its size, the limit and the fix,
instead of filling the memory. Each limit has a default and an environment variable that changes it, e.g.
``LIFT3D_MAX_PHOTO_PIXELS=400000000 lift3d reconstruct ...`` for a set of 400-megapixel photos."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """The most of ``unit`` that one ``what`` may hold (``default``, or the environment variable ``env``)."""

    what: str  # what is limited, for the message: "a photo", "a video frame"
    unit: str  # what is counted: "pixels", "Gaussians", "bytes"
    default: int
    env: str  # the environment variable that sets it

    @property
    def value(self) -> int:
        """The limit in force: ``env`` when it holds a positive whole number, else the default."""
        text = os.environ.get(self.env, "").strip().replace("_", "")
        return int(text) if text.isdigit() and int(text) > 0 else self.default

    def exceeded(self, amount: int) -> bool:
        return amount > self.value

    def message(self, name: str, amount: int, detail: str, fix: str) -> str:
        """One line: ``name`` holds ``amount`` (``detail``: e.g. "100000 x 100000 px"), over the limit; the fix, or
        the variable that raises the limit."""
        said = f"{detail} = " if detail else ""
        return (f"{name} is too large: {said}{amount:,} {self.unit}, over lift3d's limit for {self.what} "
                f"({self.value:,} {self.unit}); {fix}, or raise the limit with {self.env}={max(amount, self.value + 1)} if "
                "the file is genuine and the machine has the memory")

    def check(self, name: str, amount: int, error: type[Exception], fix: str, detail: str = "") -> None:
        """Raise ``error`` (the reader's own user error) with ``message`` when ``amount`` is over the limit."""
        if self.exceeded(amount):
            raise error(self.message(name, amount, detail, fix))


PHOTO_PIXELS = Limit("a photo", "pixels", 200_000_000, "LIFT3D_MAX_PHOTO_PIXELS")
TEXTURE_PIXELS = Limit("an image inside a 3D file", "pixels", 100_000_000, "LIFT3D_MAX_TEXTURE_PIXELS")
VIDEO_FRAMES = Limit("a video", "frames", 100_000, "LIFT3D_MAX_VIDEO_FRAMES")
VIDEO_FRAME_PIXELS = Limit("a video frame", "pixels", 67_108_864, "LIFT3D_MAX_VIDEO_FRAME_PIXELS")
GAUSSIANS = Limit("a Gaussian file", "Gaussians", 50_000_000, "LIFT3D_MAX_GAUSSIANS")
GAUSSIAN_FILE_BYTES = Limit("a Gaussian file", "bytes", 16 * 2**30, "LIFT3D_MAX_GAUSSIAN_FILE_BYTES")
CONFIG_BYTES = Limit("a config or recipe file", "bytes", 8 * 2**20, "LIFT3D_MAX_CONFIG_BYTES")

LIMITS = (PHOTO_PIXELS, TEXTURE_PIXELS, VIDEO_FRAMES, VIDEO_FRAME_PIXELS, GAUSSIANS, GAUSSIAN_FILE_BYTES, CONFIG_BYTES)
