"""Editing a capture whose photos have several sizes (stored padded to the largest): the editor sees each photo at its
own size, and the edit fills that photo's region of the target store, leaving the padding (never trained on) alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.config import ConfigError
from lift3d.data.edited_targets import EditedTargets
from lift3d.data.summary import SceneSummary
from lift3d.systems.edit import IterativeEditing


def test_an_edit_of_a_padded_photo_fills_only_the_photo():
    store = EditedTargets(torch.full((2, 6, 8, 3), 0.5))
    store.update(1, torch.full((4, 3, 3), 0.25), size=(3, 4))  # a 3x4 (width x height) photo padded to 8x6
    target = store.images([1])[0]
    assert torch.allclose(target[:4, :3], torch.tensor(0.25), atol=1 / 255)
    assert torch.allclose(target[4:], torch.tensor(0.5), atol=1 / 255)
    assert torch.allclose(target[:, 3:], torch.tensor(0.5), atol=1 / 255)
    assert torch.equal(store.images([0]), torch.full((1, 6, 8, 3), 128 / 255))  # other views untouched


class _Editor:
    def __init__(self) -> None:
        self.seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def edit(self, render, photo, generator):
        self.seen.append((tuple(render.shape), tuple(photo.shape)))
        return torch.zeros_like(render)


class _Editing(IterativeEditing):
    """Just enough of a system for ``edit_views``: a constant render at the padded size."""

    def __init__(self, sizes: list[tuple[int, int]]) -> None:
        self._init_editing()
        self.cfg = SimpleNamespace(edit_count=2, save_edits_every=0)
        self.device = torch.device("cpu")
        self.training = True
        self._targets = EditedTargets(torch.full((2, 6, 8, 3), 0.5))
        self._cameras = Cameras(torch.eye(4)[None].expand(2, 4, 4).clone(), torch.eye(3)[None].expand(2, 3, 3).clone(), 8, 6)
        self._background = torch.ones(3)
        self._sizes = sizes
        self._unsaved = {"editor": _Editor()}
        self.logged: dict[str, float] = {}

    @property
    def editor(self):
        return self._unsaved["editor"]

    def render_for_edit(self, cameras, background):
        return torch.ones(1, cameras.height, cameras.width, 3)

    def eval(self):
        self.training = False

    def train(self, mode=True):
        self.training = mode

    def log_step(self, name, value):
        self.logged[name] = value


def test_the_editor_sees_each_photo_at_its_own_size():
    system = _Editing([(8, 6), (3, 4)])
    system.edit_views(step=0)
    assert system.editor.seen == [((1, 6, 8, 3), (1, 6, 8, 3)), ((1, 4, 3, 3), (1, 4, 3, 3))]
    padded = system._targets.images([1])[0]
    assert torch.allclose(padded[:4, :3], torch.tensor(0.0)) and torch.allclose(padded[4:], torch.tensor(0.5), atol=1 / 255)
    assert torch.allclose(system._targets.images([0])[0], torch.tensor(0.0))


def test_editing_takes_its_target_store_cameras_and_photo_sizes_from_the_scene_summary():
    system = _Editing([])
    system._targets = system._sizes = None
    system._trainer = object()  # training (setup_editing does nothing without a trainer)
    system.cfg.geometry_convert_from = ""
    system.registered_name = "edit-gaussians"
    store = EditedTargets(torch.full((2, 6, 8, 3), 0.5))
    cameras = Cameras(torch.eye(4)[None].expand(2, 4, 4).clone(), torch.eye(3)[None].expand(2, 3, 3).clone(), 8, 6)
    system.scene = SceneSummary(cameras=cameras, image_sizes=((8, 6), (3, 4)), background=torch.zeros(3),
                                edit_targets=lambda: store)
    system.setup_editing("fit")
    assert system._targets is store and system._cameras is cameras and system._sizes == [(8, 6), (3, 4)]
    assert torch.equal(system._background, torch.zeros(3))
    system.scene = SceneSummary(cameras=cameras, image_sizes=((8, 6),) * 2, background=torch.zeros(3),
                                edit_targets=lambda: store)
    system._sizes = None
    system.setup_editing("fit")
    assert system._sizes is None  # photos of one size: edits fill the whole target
    for no_store in (SceneSummary(object_centric=True), None):  # random views (generation); no data at all
        system.scene = no_store
        with pytest.raises(ConfigError, match="edit-gaussians trains on posed photos: set data_type: posed-images"):
            system.setup_editing("fit")
