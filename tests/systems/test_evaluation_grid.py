"""Validation grids say what each column is: a label band above the photo, the render, the depth, ..."""

import numpy as np
import torch

from lift3d.imaging import hstack_panels
from lift3d.systems.evaluation import LABEL_HEIGHT, grid_panels, labeled_panels


def test_each_column_has_its_label_above_it():
    size = 40
    out = {"rgb": torch.rand(1, size, 48, 3), "depth": torch.rand(1, size, 48, 1) + 1, "alpha": torch.ones(1, size, 48, 1)}
    batch = {"rgb": torch.rand(1, size, 48, 3)}
    panels = grid_panels(out, batch, 0)
    assert [label for _, _, label in panels] == ["photo", "render", "depth", "alpha"]
    labeled = labeled_panels([*panels, ("rgb", torch.rand(size, 48, 3))])  # a panel a system adds without a label
    assert all(kind == "rgb" and image.shape == (size + LABEL_HEIGHT, 48, 3) for kind, image in labeled)
    bands = [image[:LABEL_HEIGHT] for _, image in labeled]
    assert all((band < 128).any() for band in bands[:4])  # dark text on each labeled band
    assert (bands[4] == 255).all()  # the unlabeled panel's band is blank, so the columns line up
    assert not np.array_equal(bands[0], bands[1])  # "photo" and "render" read differently
    for (_, image), (_, source, _) in zip(labeled[:2], panels[:2]):
        expected = (source.numpy().clip(0, 1) * 255 + 0.5).astype(np.uint8)
        assert np.abs(image[LABEL_HEIGHT:].astype(int) - expected).max() <= 1  # the panel itself is untouched
    grid = hstack_panels([image for _, image in labeled])
    assert grid.shape[0] == size + LABEL_HEIGHT


def test_a_grid_of_a_run_without_photos_starts_with_the_render():
    out = {"rgb": torch.rand(2, 16, 16, 3), "normal": torch.rand(2, 16, 16, 3)}
    assert [label for _, _, label in grid_panels(out, {}, 1)] == ["render", "normal"]
