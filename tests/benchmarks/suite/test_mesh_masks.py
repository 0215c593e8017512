"""The mesh_masks benchmark's measures: mask IoU, and an exported mesh moved back into the frame its model trained in."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.suite.mesh_masks import iou, to_training_frame
from lift3d.meshes.mesh import Mesh


def test_mask_iou_per_view():
    a = torch.zeros(3, 4, 4, dtype=torch.bool)
    b = torch.zeros(3, 4, 4, dtype=torch.bool)
    a[0, :2], b[0, 1:3] = True, True  # 4 shared of 12 pixels
    a[1], b[1] = True, True
    assert iou(a, b).tolist() == pytest.approx([1 / 3, 1.0, 1.0])  # two empty masks agree


def test_an_exported_mesh_goes_back_into_the_training_frame():
    capture = Mesh(np.array([[0.0, 0, 0], [1, 0, 0], [0, 2, 0]], np.float32), np.array([[0, 1, 2]]))
    world_from_capture = np.diag([0.5, 0.5, 0.5, 1.0])
    world_from_capture[:3, 3] = [1.0, 0.0, -1.0]
    world = to_training_frame(capture, world_from_capture)
    np.testing.assert_allclose(world.vertices, [[1.0, 0, -1], [1.5, 0, -1], [1.0, 1, -1]])
