"""Turntables frame what they show, whatever the source: a mesh run (its vertices), a NeRF-style field (the space
its density occupies) and a source with only a mesh (the mesh the export builds)."""

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.export import ExportConfig, ExportSources, export_formats, mesh_from_field
from lift3d.export.sources import field_content_points
from lift3d.saving import OutputSaver

CENTRE = (0.6, -0.4, 0.3)  # the small objects sit away from the origin
# 5 frames: no two views of a cube alike (a GIF merges equal frames)
SMALL = dict(video_frames=5, video_width=48, video_height=48, resolution=32, target_faces=0, texture_size=0)


def _coverage(path) -> tuple[np.ndarray, np.ndarray]:
    """Per frame of a video file: the share of pixels that differ from the background (the corner pixel's color),
    and the center [2] (x, y in 0..1 of the frame) of those pixels."""
    frames = iio.imread(path, index=None)[..., :3].astype(float)
    mask = np.abs(frames - frames[:, :1, :1]).max(axis=-1) > 40
    height, width = mask.shape[1:]
    ys, xs = np.mgrid[0:height, 0:width]
    count = mask.sum(axis=(1, 2)).clip(min=1)
    centers = np.stack([(mask * xs).sum(axis=(1, 2)) / count / width, (mask * ys).sum(axis=(1, 2)) / count / height], -1)
    return mask.mean(axis=(1, 2)), centers


def _assert_framed(path, frames: int) -> None:
    filled, centers = _coverage(path)
    assert len(filled) == frames and filled.min() >= 0.2, filled  # every frame: the object, not a speck
    assert filled.max() < 0.9, filled  # whole, with a margin
    assert np.abs(centers - 0.5).max() < 0.1, centers  # centered


def _box_density(points: torch.Tensor, half: float = 0.1) -> torch.Tensor:
    """A 0.2-unit cube of density 50 around CENTRE (25 on its faces)."""
    inside = (half - (points - torch.tensor(CENTRE)).abs()).min(dim=-1).values
    return 50.0 * torch.sigmoid(inside / 0.01)


def _render_box(cameras: Cameras, half: float = 0.1) -> dict[str, torch.Tensor]:
    """Exact renders of the cube (ray-box slabs): red on white."""
    origins, directions = cameras.rays(normalized=True)
    directions = torch.where(directions.abs() < 1e-9, torch.full_like(directions, 1e-9), directions)
    center = torch.tensor(CENTRE)
    near, far = (center - half - origins) / directions, (center + half - origins) / directions
    enter = torch.minimum(near, far).max(dim=-1).values
    leave = torch.maximum(near, far).min(dim=-1).values
    hit = leave >= enter.clamp(min=0)
    rgb = torch.where(hit[..., None], torch.tensor([0.8, 0.1, 0.1]), torch.ones(3))
    return {"rgb": rgb, "alpha": hit.float()[..., None]}


def test_a_field_source_frames_the_space_its_density_occupies(tmp_path):
    box = [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]
    cfg = ExportConfig(**SMALL)
    points = field_content_points(_box_density, box, cfg)()
    assert (points - torch.tensor(CENTRE)).abs().max() < 0.12  # only the cube, not the box around it
    sources = ExportSources(render_fn=_render_box, content_points=field_content_points(_box_density, box, cfg))
    export_formats(OutputSaver(tmp_path), ["gif"], cfg, sources, stem="field")
    _assert_framed(tmp_path / "field-orbit.gif", 5)
    # the fixed orbit (3 units from the origin) shows the same cube far smaller, off center
    export_formats(OutputSaver(tmp_path), ["gif"], ExportConfig(**SMALL, video_framing="fixed"), sources, stem="fixed")
    assert _coverage(tmp_path / "fixed-orbit.gif")[0].max() < 0.1


def test_an_empty_field_frames_its_whole_box():
    points = field_content_points(lambda p: torch.zeros(len(p)), [[-1, -2, -1], [1, 2, 3]], ExportConfig(**SMALL))()
    assert points.min(0).values.tolist() == [-1, -2, -1] and points.max(0).values.tolist() == [1, 2, 3]


def test_a_source_with_only_a_mesh_frames_the_mesh(tmp_path):
    """No content points (a third-party system, say): the turntable frames the mesh the export builds."""
    box = [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]
    cfg = ExportConfig(**{**SMALL, "resolution": 96})  # a mesh as fine as the frames, so its bounds are the cube's
    sources = ExportSources(mesh=lambda: mesh_from_field(_box_density, box, cfg), render_fn=_render_box)
    export_formats(OutputSaver(tmp_path), ["gif"], cfg, sources, stem="mesh")
    _assert_framed(tmp_path / "mesh-orbit.gif", 5)


@pytest.mark.parametrize("suffix", ["glb", "obj"])
def test_a_mesh_run_of_a_small_mesh_file_frames_it(tmp_path, suffix):
    """A 0.2-unit cube written by trimesh away from the origin, textured as it is (normalize=false): the turntable
    of the texture-mesh run orbits it, filling and centring every frame."""
    import trimesh

    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.registry import find

    cube = trimesh.creation.box(extents=(0.2, 0.2, 0.2))
    cube.apply_translation(CENTRE)
    cube.export(str(tmp_path / f"cube.{suffix}"))
    overrides = [f"system.geometry.path={tmp_path / f'cube.{suffix}'}", "system.geometry.normalize=false",
                 "system.geometry.up_axis=+z", "system.geometry.front_axis=+x", "system.background_type=solid-color",
                 "system.background.color=[1.0,1.0,1.0]", "system.geometry.texture.encoding.n_levels=2",
                 "system.geometry.texture.encoding.log2_hashmap_size=8", "system.geometry.texture.encoding.base_resolution=4",
                 "system.renderer.antialias=false", "system.guidance.pretrained_model_name_or_path=unused",
                 *(f"system.export.{key}={value}" for key, value in SMALL.items())]
    cfg = load_config(recipe_config("texture-mesh"), overrides=overrides)
    system = find(cfg.system_type)(cfg.system).eval()
    sources = system.export_sources()
    export_formats(OutputSaver(tmp_path), ["gif"], system.cfg.export, sources, stem="run")
    _assert_framed(tmp_path / "run-orbit.gif", 5)


def test_a_nerf_run_frames_what_its_density_occupies(tmp_path):
    """A dreamfusion system (untrained, tiny) whose density and renders are the cube's: its export sources frame it."""
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.registry import find

    overrides = ["system.field.encoding.n_levels=2", "system.field.encoding.log2_hashmap_size=8",
                 "system.field.encoding.base_resolution=4", "system.renderer.occupancy.resolution=8",
                 "system.guidance.pretrained_model_name_or_path=unused",
                 *(f"system.export.{key}={value}" for key, value in SMALL.items())]
    cfg = load_config(recipe_config("dreamfusion-sd"), overrides=overrides)
    system = find(cfg.system_type)(cfg.system).eval()
    system.density_at = _box_density  # the field as trained on the cube would be, without the training
    system.render_views = lambda batch: _render_box(batch["cameras"])
    sources = system.export_sources()
    assert sources.content_points is not None
    export_formats(OutputSaver(tmp_path), ["gif"], system.cfg.export, sources, stem="nerf")
    _assert_framed(tmp_path / "nerf-orbit.gif", 5)
