"""The training targets of an edited reconstruction: one image per training view that starts as the photo
and is replaced, view by view, while the scene trains on it (Instruct-NeRF2NeRF's iterative dataset update).

The posed-images data module reads its training colors from this store when it has one, for whole-image
batches (Gaussians) and ray batches (NeRF) alike; the editing system writes edited views into it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_bytes(images: Tensor) -> Tensor:
    """Images in 0..1 (any float dtype) -> uint8, rounded (what the store keeps: the photos' own precision)."""
    return (images.detach().float().clamp(0, 1) * 255.0).round().to(torch.uint8)


class EditedTargets:
    """Per-view target colors [N, H, W, 3] (uint8, composited on the training background), the photos they
    started from, and how many times each view has been edited.

    Photos with alpha masks (object captures) keep their background: an edit is composited over the training
    background through the photo's mask, so the edit changes the object, not the backdrop it was shot on."""

    def __init__(self, photos: Tensor, alpha: Tensor | None = None, background: Tensor | None = None) -> None:
        if photos.ndim != 4 or photos.shape[-1] != 3:
            raise ValueError(f"EditedTargets takes photos [N, H, W, 3] in 0..1, got {tuple(photos.shape)}")
        self.original = to_bytes(photos)
        self.rgb = self.original.clone()
        self.edits = torch.zeros(len(photos), dtype=torch.long)
        masked = alpha is not None and background is not None and bool((alpha < 1).any())
        self.alpha = to_bytes(alpha) if masked else None  # [N, H, W, 1] or None (no masks: edits replace everything)
        self.background = background.float().reshape(3) if masked else None

    def __len__(self) -> int:
        return len(self.rgb)

    def images(self, index: Tensor | list[int]) -> Tensor:
        """The current targets of views ``index`` as floats [B, H, W, 3] in 0..1."""
        return self.rgb[index].float() / 255.0

    def pixels(self, flat_index: Tensor) -> Tensor:
        """Current target colors [P, 3] at flat pixel indices into [N * H * W] (ray batches)."""
        return self.rgb.reshape(-1, 3)[flat_index].float() / 255.0

    def photo(self, view: int) -> Tensor:
        """The unedited photo of ``view`` [H, W, 3] in 0..1 (what an editor is conditioned on)."""
        return self.original[view].float() / 255.0

    def update(self, view: int, image: Tensor, size: tuple[int, int] | None = None) -> None:
        """Replace the target of ``view`` with ``image`` [H, W, 3] in 0..1 (resized first if its size differs).
        ``size`` (width, height): the photo's own size when it is stored padded to a larger one (a mixed-size
        capture); the edit then fills that top-left region and the padding, never trained on, stays as it was."""
        height, width = self.rgb.shape[1:3]
        if size is not None:
            width, height = size
        if image.shape[:2] != (height, width):
            image = torch.nn.functional.interpolate(image.permute(2, 0, 1)[None].float(), size=(height, width),
                                                    mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
        image = image.float().to(self.rgb.device)
        if self.alpha is not None:
            alpha = self.alpha[view, :height, :width].float() / 255.0
            image = alpha * image + (1 - alpha) * self.background
        self.rgb[view, :height, :width] = to_bytes(image)
        self.edits[view] += 1
