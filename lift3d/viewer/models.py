"""What the viewer shows: a model that renders lift3d cameras (a run's system, a Gaussian file, a mesh), its
training photos as frustums, and one picture per render mode (rgb, depth, alpha, normal)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lift3d.cameras import Cameras
from lift3d.framing import framing_camera
from lift3d.imaging import depth_to_rgb, grayscale_to_rgb, normal_to_rgb, to_numpy_image
from lift3d.viewer.camera_math import normals_from_depth

log = logging.getLogger("lift3d.viewer")
RENDER_MODES = ("rgb", "depth", "alpha", "normal")
MESH_SUFFIXES = (".glb", ".gltf", ".obj")  # a .glb is a mesh unless it uses KHR_gaussian_splatting
RenderFn = Callable[[Cameras], dict[str, Tensor]]


@dataclass
class TrainingViews:
    """The photos a model was trained on: cameras and small copies of the images for the frustums."""

    cameras: Cameras  # [N] lift3d cameras (OpenGL c2w)
    thumbnails: list[np.ndarray]  # uint8 [h, w, 3] per camera
    # (width, height) of each photo when they differ (the cameras then hold the padded size)
    sizes: list[tuple[int, int]] | None = None


@dataclass
class ViewModel:
    """A model the viewer can draw."""

    render_fn: RenderFn  # cameras -> {"rgb": [B,H,W,3], "alpha", "depth", "normal"?}
    name: str  # shown in the page's title
    folder: Path  # where recorded camera paths are saved by default
    training_views: TrainingViews | None = None  # frustums with photos (posed-photo runs only)
    system: Any = None  # the Lightning system when the model is a run (for its Gaussian count)
    home: tuple[tuple[float, ...], tuple[float, ...]] | None = None  # (camera position, look-at) the page starts at


def render_mode_image(out: dict[str, Tensor], mode: str, cameras: Cameras) -> np.ndarray:
    """uint8 [H, W, 3] picture of the first view of renderer outputs ``out`` in ``mode`` (rgb, depth, alpha, normal);
    a renderer without normals shows the normals of its depth map."""
    if mode not in RENDER_MODES:
        raise ValueError(f"unknown render mode {mode!r}; use one of {', '.join(RENDER_MODES)}")
    alpha = out["alpha"][:1].float() if "alpha" in out else torch.ones_like(out["rgb"][:1, ..., :1]).float()
    if mode == "rgb":
        return to_numpy_image(out["rgb"][0, ..., :3].float().clamp(0, 1))
    if mode == "alpha":
        return grayscale_to_rgb(alpha[0].clamp(0, 1))
    covered = alpha[0] > 0.5
    if mode == "depth":
        return depth_to_rgb(out["depth"][0].float(), covered)
    normal = out["normal"][:1].float() if "normal" in out else normals_from_depth(out["depth"][:1].float(), cameras[:1])
    return normal_to_rgb(torch.where(covered, normal[0].clamp(-1, 1), torch.full_like(normal[0], -1.0)))


@torch.no_grad()
def render_picture(model: ViewModel, cameras: Cameras, mode: str, device: torch.device | str) -> np.ndarray:
    """Render one view of ``model`` and return it as a picture in ``mode``."""
    out = model.render_fn(cameras.to(device))
    return render_mode_image(out, mode, cameras)


def home_camera(views: TrainingViews | None, pull_back: float = 1.35) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Where the page's camera starts: behind the first training camera (so its frustum and photo are in view),
    looking at the origin; None (viser's default) without training views."""
    if views is None:
        return None
    return tuple((views.cameras.positions[0] * pull_back).tolist()), (0.0, 0.0, 0.0)


def training_views_of(datamodule: Any, max_views: int = 200, thumbnail_side: int = 96) -> TrainingViews | None:
    """The posed photos of a posed-images data module (``datamodule.train``: cameras and rgba), at most
    ``max_views`` evenly picked, as thumbnails; None for data without photos (random views of text-to-3D)."""
    scene = getattr(datamodule, "train", None)
    cameras, rgba = getattr(scene, "cameras", None), getattr(scene, "rgba", None)
    if not isinstance(cameras, Cameras) or not torch.is_tensor(rgba) or rgba.ndim != 4:
        return None
    picked = torch.linspace(0, len(cameras) - 1, min(max_views, len(cameras))).round().long().unique()
    step = max(1, max(cameras.width, cameras.height) // thumbnail_side)
    # photos of several sizes are padded to one (lift3d.data.scene): each frustum shows its own photo at its own size
    sizes = [scene.size(int(i)) for i in picked] if getattr(scene, "sizes", None) is not None else None
    thumbs = []
    for k, i in enumerate(picked):
        width, height = sizes[k] if sizes else (cameras.width, cameras.height)
        thumbs.append(rgba[int(i), :height, :width][::step, ::step, :3].cpu().numpy().astype(np.uint8))
    return TrainingViews(cameras[picked], thumbs, sizes)


def _run_model(run_dir: Path, checkpoint: Path, device: torch.device, allow_imports: bool = False) -> ViewModel:
    from lift3d.config import load_config
    from lift3d.registry import find
    from lift3d.runs.run_dirs import load_system

    # the run's config may list plugin code (imports:); a run folder may be someone else's: run it only when allowed
    parsed = run_dir / "configs" / "parsed.yaml"
    cfg = load_config(parsed, overrides=[f"resume={checkpoint}"], allow_imports=allow_imports or None)
    system = load_system(cfg, checkpoint, device).eval()
    views = None
    try:
        views = training_views_of(find(cfg.data_type)(cfg.data))
    except Exception as error:  # noqa: BLE001  (the photos may have moved since training; the model still shows)
        log.info("no training cameras to show (%s)", str(error).splitlines()[0] if str(error) else type(error).__name__)
    log.info("viewing %s (%s, step %d)", run_dir, cfg.system_type, system.true_global_step)
    return ViewModel(lambda cameras: system.render_views({"cameras": cameras}), f"{run_dir.name} ({cfg.system_type})",
                     run_dir, views, system)


def gaussian_suffixes() -> tuple[str, ...]:
    """The suffixes of every Gaussian file lift3d reads (the registry's Gaussian codecs: ``lift3d.gaussians.formats.files``)."""
    from lift3d.gaussians.formats.files import reader_suffixes

    return reader_suffixes()


def _gaussian_file_model(path: Path, device: torch.device) -> ViewModel:
    """The Gaussians of a file as ``lift3d export`` reads them (``gaussian_file_system``), rendered by that system."""
    from lift3d.sh import degree_of
    from lift3d.systems.gaussian_files import gaussian_file_system

    system, params = gaussian_file_system(path)
    degree = degree_of(params["shN"].shape[1] + 1)
    system.to(device).eval()
    log.info("viewing %d Gaussians (SH degree %d) from %s", len(params["means"]), degree, path)
    name = f"{path.parent.name}/{path.name}" if path.suffix.lower() == ".json" else path.name  # lod-meta.json: its folder
    return ViewModel(lambda cameras: system.render_views({"cameras": cameras}), name, path.parent, None, system,
                     home=framing_camera(params["means"]))


def _mesh_model(path: Path, device: torch.device) -> ViewModel:
    from lift3d.config import ConfigError
    from lift3d.meshes.io import load_mesh
    from lift3d.render.meshes.renderer import MeshRenderer

    try:
        # glTF's +y up turned into lift3d's +z up; corners keep their own vertex (sharp per-face colors)
        mesh = load_mesh(path, normalize=False, weld=False).to(device)
    except ValueError as error:  # not a mesh file, one without triangles, or one that names a file that is missing
        raise ConfigError(f"cannot view {path}: {error}") from None
    renderer = MeshRenderer({"antialias": False})
    log.info("viewing a mesh of %d vertices and %d faces from %s", len(mesh.vertices), len(mesh.faces), path)
    return ViewModel(lambda cameras: renderer(mesh, cameras), path.name, path.parent, home=framing_camera(mesh.vertices.cpu()))


def viewable() -> str:
    """What ``lift3d view`` and ``lift3d render`` open, for their error messages."""
    named = {".json": "a streamed SOG's lod-meta.json or its folder"}
    gaussian = ", ".join(f"KHR_gaussian_splatting {s}" if s in MESH_SUFFIXES else named.get(s, s) for s in gaussian_suffixes())
    return f"a run folder, a .ckpt in one, a Gaussian file ({gaussian}) or a mesh ({', '.join(MESH_SUFFIXES)})"


def load_view_model(source: str | Path, device: torch.device | str = "cpu", allow_imports: bool = False) -> ViewModel:
    """The model at ``source``: a run folder (its ckpts/last.ckpt), a checkpoint inside a run, any Gaussian file
    lift3d reads (``gaussian_suffixes``; a .glb when it uses KHR_gaussian_splatting; a streamed SOG's folder) or a
    mesh (.glb, .gltf, .obj).
    A run's config may import its plugins only with ``allow_imports``."""
    from lift3d.config import ConfigError
    from lift3d.gaussians.formats.gltf import is_gaussian_glb
    from lift3d.gaussians.formats.sog_lod import bundle_meta
    from lift3d.runs.run_dirs import run_dir_of_checkpoint

    path, device = Path(source).expanduser(), torch.device(device)
    if path.is_dir() and bundle_meta(path) is not None:  # a streamed SOG (sog-lod) given as its folder
        return _gaussian_file_model(bundle_meta(path), device)
    if path.is_dir():
        if not (path / "configs" / "parsed.yaml").is_file():
            raise ConfigError(f"{path} is not a run folder (no configs/parsed.yaml): give {viewable()}")
        checkpoint = path / "ckpts" / "last.ckpt"
        if not checkpoint.is_file():
            raise ConfigError(f"{path} has no checkpoint to show ({checkpoint} is missing): give one of its ckpts/*.ckpt")
        return _run_model(path, checkpoint, device, allow_imports)
    if not path.is_file():
        raise FileNotFoundError(f"nothing to view at {path}: give {viewable()}")
    suffix = path.suffix.lower()
    if suffix == ".ckpt":
        run_dir = run_dir_of_checkpoint(path)
        if run_dir is None:
            raise ConfigError(f"{path} is not inside a run folder (RUN/ckpts/x.ckpt with RUN/configs/): give the run folder")
        return _run_model(run_dir, path, device, allow_imports)
    if (suffix == ".glb" and is_gaussian_glb(path)) or (suffix in gaussian_suffixes() and suffix not in MESH_SUFFIXES):
        return _gaussian_file_model(path, device)
    if suffix in MESH_SUFFIXES:
        return _mesh_model(path, device)
    raise ConfigError(f"cannot view {path}: lift3d does not read {suffix or 'files without an extension'}; give {viewable()}")
