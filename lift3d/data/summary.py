"""What a system may know of its training data: a typed summary every data module gives (``scene_summary()``) and the
runner hands to the system before training (``BaseSystem.set_scene``), so no system reaches into a data module.

Posed photos (reconstruction, editing) fill the camera and photo fields; generation from random views leaves them
empty; image-to-3D adds its reference view. A system loaded without data (an export from a checkpoint) has none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.data.edited_targets import EditedTargets


@dataclass(frozen=True, eq=False)
class ReferenceView:
    """The reference photo of image-to-3D and the camera that took it."""

    rgba: Tensor  # [H, W, 4] float 0..1 (straight alpha)
    cameras: Cameras  # one camera
    elevation_deg: float
    azimuth_deg: float
    distance: float

    def composited(self, background: Tensor) -> Tensor:
        """[H, W, 3] on ``background`` [3]."""
        return self.rgba[..., :3] * self.rgba[..., 3:] + background * (1 - self.rgba[..., 3:])


@dataclass(frozen=True, eq=False)
class SceneSummary:
    """The facts of a run's training data that systems read (bounds, initialization, per-photo parts, references).

    Tensors are the data module's own (not copies): read them, never write them."""

    # the training photos (posed-images; none for generation)
    cameras: Cameras | None = None  # [N] training views, at the common (padded) size when photos differ in size
    image_sizes: tuple[tuple[int, int], ...] = ()  # each training photo's own (width, height), without padding
    images: Tensor | None = None  # [N, H, W, 4] uint8 RGBA training photos (smaller ones padded at right and bottom)
    extent: float = 0.0  # radius of the training cameras' centers around their mean x 1.1 (3DGS's scene extent)
    points: Tensor | None = None  # [P, 3] sparse points of the capture in the training frame (None: none)
    point_colors: Tensor | None = None  # [P, 3] their colors in 0..1
    background: Tensor | None = None  # [3] RGB the photos (or the reference photo) are composited on
    capture_format: str | None = None  # the layout the photos came in (colmap, blender, ...; None: no photo capture)
    object_centric: bool = False  # one object seen from around it, in lift3d's frame (renders, generation)
    batches_name_their_photos: bool = True  # every training batch carries ``index`` (the photo of each view or ray)
    # the store of training targets an editing run rewrites (created on the first call; training colors come from it
    # from then on); None: the data module trains on fixed targets
    edit_targets: Callable[[], EditedTargets] | None = None
    reference: ReferenceView | None = None  # image-to-3D: the reference photo and its camera
    # [4, 4] float64 the similarity taking the capture's poses into the training frame (None: the capture's own frame)
    world_from_capture: Tensor | None = None

    @property
    def n_photos(self) -> int:
        """The number of training photos (0: none, e.g. generation)."""
        return 0 if self.cameras is None else len(self.cameras)

    @property
    def mixed_sizes(self) -> bool:
        """Whether the training photos differ in size (they train padded to the largest)."""
        return len(set(self.image_sizes)) > 1

    @property
    def has_masks(self) -> bool:
        """Whether some training photo has transparent pixels (object cut-outs)."""
        return self.images is not None and bool((self.images[..., 3] < 255).any())
