"""What every scene reader returns: the frames of a capture (image file, pose, lens) before any pixel is read.

Readers (one per format in ``lift3d.data.formats``) only parse their files into a ``Capture``;
``lift3d.data.scene`` then loads, undistorts, normalizes and splits it the same way for every format.
Poses are camera-to-world with OpenGL camera axes (``lift3d.cameras``), in the reader's world frame.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# lens models lift3d undistorts (OpenCV's two families); every other model is refused by name
LENS_KINDS = ("pinhole", "opencv", "fisheye")


class SceneFormatError(ValueError):
    """A scene folder, transforms file, COLMAP model or image set that lift3d cannot read; the message says
    what to fix."""


@dataclass(frozen=True)
class Lens:
    """A camera's intrinsics in pixels (pixel centers at i + 0.5, as COLMAP and lift3d) and its distortion.

    ``kind`` is ``pinhole`` (no distortion), ``opencv`` (``coeffs`` = k1 k2 p1 p2 [k3 [k4 k5 k6]], OpenCV's
    radial-tangential model) or ``fisheye`` (``coeffs`` = k1 k2 k3 k4, OpenCV's equidistant model).
    """

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    kind: str = "pinhole"
    coeffs: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in LENS_KINDS:
            raise SceneFormatError(f"unknown lens kind {self.kind!r} (known: {', '.join(LENS_KINDS)})")

    @property
    def distorted(self) -> bool:
        return self.kind != "pinhole" and any(abs(c) > 0.0 for c in self.coeffs)

    def matrix(self) -> np.ndarray:
        """The 3x3 pinhole matrix (lift3d's pixel-center convention)."""
        return np.array([[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]])

    def scaled(self, width: int, height: int) -> Lens:
        """The same lens for the image resized to ``width`` x ``height`` (distortion is resolution-free)."""
        sx, sy = width / self.width, height / self.height
        return Lens(width, height, self.fx * sx, self.fy * sy, self.cx * sx, self.cy * sy, self.kind, self.coeffs)

    def describe(self) -> str:
        names = {"opencv": ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6"),
                 "fisheye": ("k1", "k2", "k3", "k4")}.get(self.kind, ())
        terms = " ".join(f"{n}={c:.4g}" for n, c in zip(names, self.coeffs) if c)
        return f"{self.kind} {self.width}x{self.height} fx={self.fx:.1f} fy={self.fy:.1f}" + (f" {terms}" if terms else "")


def check_camera(c2w: np.ndarray, lens: Lens, source: object, frame: str) -> None:
    """Refuse a degenerate camera by its frame: a pose whose rotation block is singular (a zero matrix, a
    flattened axis) or a lens without a positive focal length or size. NaN and infinities are left to the
    capture-wide check, which names every such frame at once."""
    fix = "fix or remove that frame in its poses file, or recover every pose again with lift3d poses SCENE_FOLDER --force"
    if np.isfinite(c2w).all():
        singular = np.linalg.svd(np.asarray(c2w, np.float64)[:3, :3], compute_uv=False)
        if singular[0] < 1e-9 or singular[-1] < 1e-6 * singular[0]:
            raise SceneFormatError(f"{source}: the camera of frame {frame} is degenerate (its camera-to-world rotation "
                                   f"has singular values {', '.join(f'{v:.3g}' for v in singular)}: a zero or flattened "
                                   f"matrix, not a pose); {fix}")
    values = [lens.fx, lens.fy]
    if np.isfinite(values).all() and (min(values) <= 0 or lens.width <= 0 or lens.height <= 0):
        raise SceneFormatError(f"{source}: the camera of frame {frame} is degenerate (focal length {lens.fx:g} x "
                               f"{lens.fy:g} px, image {lens.width} x {lens.height} px: each must be positive); {fix}")


@dataclass
class Frame:
    """One photo of a capture: where its file is, where the camera was, and its lens."""

    image: Path
    c2w: np.ndarray  # [4, 4] camera-to-world, OpenGL camera axes, reader's world frame
    lens: Lens
    mask: Path | None = None  # optional mask (white = object or keep): the image's alpha, or its kept pixels (Capture.mask_mode)
    name: str = ""  # the name the format knows the frame by (for split files and messages)


@dataclass
class Capture:
    """Everything a reader found: frames, optional splits, optional sparse points, and notes for the log."""

    root: Path
    format: str  # the format read (``lift3d.data.formats``; the transforms.json format names its dialect)
    frames: list[Frame]
    splits: dict[str, list[int]] | None = None  # split name -> frame indices, when the format defines them
    points: np.ndarray | None = None  # [P, 3] sparse points (structure from motion), reader's world frame
    point_colors: np.ndarray | None = None  # [P, 3] uint8
    missing: list[str] = field(default_factory=list)  # frames listed whose image file is absent (skipped)
    unbounded: bool | None = None  # the format says the scene extends past its object (instant-ngp aabb_scale > 1)
    notes: list[str] = field(default_factory=list)  # what the reader decided, said once in the log
    # what the format's masks mean: alpha (an object cut-out) or ignore (pixels left out of the loss)
    mask_mode: str = "alpha"
    # every frame the format lists, image file or not (COLMAP: to pick the images of another downscale again)
    registered: list[Frame] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.frames)
