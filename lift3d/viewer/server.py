"""The viser page: per-browser camera state, GUI (render mode, stats, pause, camera-path recorder), training
frustums, and the render jobs the caller (``lift3d view``'s loop or the training callback) runs between its own work.

Rendering never happens on viser's threads: its callbacks only record cameras and clicks under a lock; the owner
asks ``next_job()`` and shows the result with ``show()``. The picture is lift3d's own render, set as the scene's
background image (as nerfstudio's viewer and nerfview do)."""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lift3d.config import ConfigError, ViewerConfig
from lift3d.runs.trainer_checks import check_listen
from lift3d.viewer.camera_math import c2w_to_viser_pose, render_size, viewer_cameras, viser_pose_to_c2w
from lift3d.viewer.models import RENDER_MODES, TrainingViews
from lift3d.viewer.path import CameraPath, Keyframe, save_camera_path

log = logging.getLogger("lift3d.viewer")


def next_render(now: float, changed_at: float, version: int, preview_version: int, full_version: int,
                last_full_at: float, settle_seconds: float, refresh_seconds: float) -> str | None:
    """Which render a browser's view needs now: ``preview`` (small, while its camera moves), ``full`` (once the camera
    has been still ``settle_seconds``, or again every ``refresh_seconds`` while a model trains) or None."""
    if full_version != version:
        if now - changed_at >= settle_seconds:
            return "full"
        return "preview" if preview_version != version else None
    if refresh_seconds > 0 and now - last_full_at >= refresh_seconds:
        return "full"
    return None


@dataclass
class ClientView:
    """One browser's camera and what has been rendered of it."""

    c2w: torch.Tensor  # [4, 4] lift3d c2w (OpenGL axes)
    fovy: float  # vertical field of view, radians
    width: int  # canvas size in pixels
    height: int
    version: int = 1  # bumped by every camera move (and mode change)
    changed_at: float = 0.0  # perf_counter of the last change
    preview_version: int = 0  # the version last rendered small
    full_version: int = 0  # the version last rendered at full size
    last_full_at: float = 0.0  # perf_counter of the last full render


@dataclass
class RenderJob:
    """A view to render: which browser, its camera, the level and the mode."""

    client_id: int
    version: int
    level: str  # preview or full
    mode: str  # rgb, depth, alpha, normal
    cameras: Any  # lift3d Cameras [1]


def require_viser() -> Any:
    try:
        import viser
    except ImportError:
        raise ConfigError("the viewer needs viser: pip install 'lift3d[viewer]'") from None
    return viser


def render_command(source: str | Path, path_json: str | Path) -> str:
    """The ``lift3d render`` command line that turns a saved camera path of ``source`` (a run folder or a file) into a
    video, quoted for a shell."""
    import shlex

    return f"lift3d render {shlex.quote(str(source))} --path {shlex.quote(str(path_json))}"


class ViewerServer:
    """A viser server showing one model; ``training`` adds the pause button and training stats."""

    def __init__(self, cfg: ViewerConfig, title: str, path_folder: Path, training: bool = False,
                 home: tuple[tuple[float, ...], tuple[float, ...]] | None = None, settle_seconds: float = 0.15,
                 source: str | Path | None = None) -> None:
        viser = require_viser()
        self.cfg, self.settle_seconds, self.path_folder = cfg, settle_seconds, Path(path_folder)
        self.source = Path(source) if source is not None else self.path_folder  # what lift3d render opens: run or file
        self._lock = threading.Lock()
        self._views: dict[int, ClientView] = {}
        self._keyframes: list[Keyframe] = []
        self._keyframe_nodes: list[Any] = []  # their frustums in the scene
        self._path_size = (640, 480)  # video size of the path: the canvas aspect of the last keyframe
        self._paused = threading.Event()
        self.mode = "rgb"
        check_listen(cfg.host, cfg.port)
        try:
            self.server = viser.ViserServer(host=cfg.host, port=cfg.port, label=title, verbose=False)
        except OSError as error:
            raise ConfigError(f"the viewer cannot listen on {cfg.host}:{cfg.port}: {error.strerror or error}; "
                              "pick another --port or --host") from None
        self.port = self.server.get_port()
        scene, gui = self.server.scene, self.server.gui
        scene.set_up_direction("+z")
        position, look_at = home or ((3.4, 0.0, 1.6), (0.0, 0.0, 0.0))
        self.server.initial_camera.position = position
        self.server.initial_camera.look_at = look_at
        self.server.initial_camera.up = (0.0, 0.0, 1.0)
        gui.configure_theme(show_share_button=False, show_logo=False)
        gui.add_markdown(f"**lift3d** · {title}")
        self.stats = gui.add_markdown("")
        self.mode_dropdown = gui.add_dropdown("Render mode", RENDER_MODES, initial_value="rgb")
        self.mode_dropdown.on_update(lambda _: self._set_mode(self.mode_dropdown.value))
        self.pause_button = None
        if training:
            self.pause_button = gui.add_button("Pause training")
            self.pause_button.on_click(lambda _: self.set_paused(not self.paused))
        with gui.add_folder("Camera path"):
            self.fps_input = gui.add_number("FPS", initial_value=30, min=1, max=240, step=1)
            self.seconds_input = gui.add_number("Seconds", initial_value=4.0, min=0.1, max=3600.0, step=0.1)
            self.path_input = gui.add_text("Save to", initial_value=str(self.path_folder / "path.json"))
            add = gui.add_button("Add keyframe")
            add.on_click(lambda event: self.add_keyframe(event.client.client_id))
            clear = gui.add_button("Clear keyframes")
            clear.on_click(lambda _: self.clear_keyframes())
            save = gui.add_button("Save path.json")
            save.on_click(lambda _: self.save_path())
            self.path_status = gui.add_markdown("0 keyframes")
        self.server.on_client_connect(self._connect)
        self.server.on_client_disconnect(lambda client: self._forget(client.client_id))

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "") else self.cfg.host
        return f"http://{host}:{self.port}/"

    # ----------------------------------------------------------------------------------- browser state
    def _connect(self, client: Any) -> None:
        client.camera.on_update(lambda camera: self.set_camera(client.client_id, camera.wxyz, camera.position, camera.fov,
                                                               camera.image_width, camera.image_height))

    def _forget(self, client_id: int) -> None:
        with self._lock:
            self._views.pop(client_id, None)

    def set_camera(self, client_id: int, wxyz: Any, position: Any, fovy: float, width: int, height: int) -> None:
        """Record a browser's camera (viser's pose, OpenCV axes): its view is rendered small now, full once still."""
        c2w = viser_pose_to_c2w(np.asarray(wxyz, dtype=np.float64), np.asarray(position, dtype=np.float64))
        with self._lock:
            view = self._views.get(client_id)
            if view is None:
                view = self._views[client_id] = ClientView(c2w, float(fovy), int(width), int(height), version=0)
            view.c2w, view.fovy, view.width, view.height = c2w, float(fovy), int(width), int(height)
            view.version += 1
            view.changed_at = time.perf_counter()

    def _set_mode(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            for view in self._views.values():  # a new mode: straight to a full picture
                view.version += 1
                view.changed_at = time.perf_counter() - self.settle_seconds

    def has_clients(self) -> bool:
        with self._lock:
            return bool(self._views)

    def next_job(self, refresh_seconds: float = 0.0) -> RenderJob | None:
        """The most urgent render among the browsers (None: every view is up to date)."""
        now = time.perf_counter()
        with self._lock:
            for client_id, view in self._views.items():
                level = next_render(now, view.changed_at, view.version, view.preview_version, view.full_version,
                                    view.last_full_at, self.settle_seconds, refresh_seconds)
                if level is None:
                    continue
                side = self.cfg.preview_max_side if level == "preview" else self.cfg.max_side
                width, height = render_size(view.width, view.height, side)
                return RenderJob(client_id, view.version, level, self.mode, viewer_cameras(view.c2w, view.fovy, width, height))
        return None

    def show(self, job: RenderJob, picture: np.ndarray) -> None:
        """Put a rendered picture behind that browser's scene and mark its view done at that level."""
        client = self.server.get_clients().get(job.client_id)
        with self._lock:
            view = self._views.get(job.client_id)
            if view is None or client is None:
                return
            if job.level == "full":
                view.full_version, view.last_full_at = job.version, time.perf_counter()
            view.preview_version = max(view.preview_version, job.version)
        client.scene.set_background_image(picture, format="jpeg", jpeg_quality=90 if job.level == "full" else 70)

    # ----------------------------------------------------------------------------------- training controls
    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def set_paused(self, paused: bool) -> None:
        """Pause or resume the training loop (the callback waits while paused)."""
        if paused:
            self._paused.set()
        else:
            self._paused.clear()
        if self.pause_button is not None:
            self.pause_button.label = "Resume training" if paused else "Pause training"

    def set_stats(self, text: str) -> None:
        self.stats.content = text

    def show_training_views(self, views: TrainingViews) -> None:
        """The training cameras as frustums carrying their photos."""
        distance = float(views.cameras.positions.norm(dim=-1).median())
        scale = max(0.02, 0.06 * distance)
        for i, (c2w, thumb) in enumerate(zip(views.cameras.c2w, views.thumbnails)):
            width, height = views.sizes[i] if views.sizes else (views.cameras.width, views.cameras.height)  # its own photo
            aspect = width / height
            wxyz, position = c2w_to_viser_pose(c2w.double())
            fovy = 2.0 * math.atan(0.5 * height / float(views.cameras.intrinsics[i, 1, 1]))
            self.server.scene.add_camera_frustum(f"/training_cameras/{i}", fov=fovy, aspect=aspect, scale=scale,
                                                 image=thumb, format="jpeg", wxyz=wxyz.numpy(), position=position.numpy())

    # ----------------------------------------------------------------------------------- camera path
    def add_keyframe(self, client_id: int) -> None:
        """Add the browser's current camera as the path's next keyframe (drawn as a small frustum)."""
        with self._lock:
            view = self._views.get(client_id)
            if view is None:
                return
            c2w, fovy, aspect = view.c2w.clone(), view.fovy, view.width / max(view.height, 1)
            self._keyframes.append(Keyframe(c2w.tolist(), math.degrees(fovy)))
            n = len(self._keyframes)
            self._path_size = render_size(view.width, view.height, self.cfg.max_side)
        wxyz, position = c2w_to_viser_pose(c2w)
        scale = max(0.02, 0.04 * float(position.norm()))  # small beside the scene, whatever its size
        self._keyframe_nodes.append(self.server.scene.add_camera_frustum(
            f"/camera_path/{n - 1}", fov=fovy, aspect=aspect, scale=scale, color=(230, 120, 20), wxyz=wxyz.numpy(),
            position=position.numpy()))
        self.path_status.content = f"{n} keyframe(s)"

    def clear_keyframes(self) -> None:
        with self._lock:
            self._keyframes, nodes, self._keyframe_nodes = [], self._keyframe_nodes, []
        for node in nodes:
            node.remove()
        self.path_status.content = "0 keyframes"

    def camera_path(self) -> CameraPath:
        with self._lock:
            width, height = self._path_size
            return CameraPath(list(self._keyframes), fps=float(self.fps_input.value), seconds=float(self.seconds_input.value),
                              width=width - width % 2, height=height - height % 2)

    def save_path(self, path: str | Path | None = None) -> Path | None:
        """Write the recorded keyframes to ``path`` (default: the page's "Save to" box) as path.json."""
        camera_path = self.camera_path()
        if not camera_path.keyframes:
            self.path_status.content = "add a keyframe first"
            return None
        target = save_camera_path(Path(path or self.path_input.value).expanduser(), camera_path)
        self.path_status.content = f"{len(camera_path.keyframes)} keyframe(s) saved to {target}"
        log.info("camera path of %d keyframes saved to %s (render it: %s)", len(camera_path.keyframes), target,
                 render_command(self.source, target))
        return target

    def stop(self) -> None:
        self.server.stop()
