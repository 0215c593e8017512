"""Camera poses for photos that have none: structure from motion with pycolmap (COLMAP's SfM as PyPI wheels).

``prepare_capture(path)`` is what ``lift3d reconstruct`` and ``lift3d poses`` call first: a video becomes a
folder of its sharpest evenly spaced frames (``lift3d.data.video``), and a folder of photos with no poses
gets a COLMAP model written beside them (``sparse/0``) by ``run_sfm``: SIFT features with one COLMAP camera
per distinct (upright size, EXIF camera) and EXIF focal lengths as priors (``lift3d.data.sfm_photos``),
matching (exhaustive for small sets, sequential for video frames), incremental mapping; each stage reports its
progress, stops on Ctrl-C within seconds and leaves what it finished for the next run (``lift3d.data.sfm_stages``).
Photos that do not register are explained from COLMAP's records (``lift3d.data.sfm_report``). A folder that
already has poses (any posed format of ``lift3d.data.formats``) is returned as it is, so a second run reuses the
model.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from lift3d.data import formats, sfm_stages
from lift3d.data.capture import SceneFormatError
from lift3d.data.formats.photos import photo_folder
from lift3d.data.formats.video import FORMAT as VIDEO
from lift3d.data.sfm_photos import CameraGroup, group_cameras, read_photo, upright_folder, usable_photos
from lift3d.data.sfm_report import REASONS, describe, explain, read_evidence
from lift3d.data.sfm_stages import SfmInterrupted, extract_features, kept_line, match_pairs, open_work, run_stoppable
from lift3d.data.transforms_json import IMAGE_SUFFIXES
from lift3d.progress import Stage

log = logging.getLogger("lift3d.sfm")
MATCHERS = ("auto", "exhaustive", "sequential")


@dataclass
class SfmOptions:
    """How structure from motion runs (``lift3d poses`` flags map onto these)."""

    matcher: str = "auto"  # auto: sequential for video frames or more than exhaustive_limit photos, else exhaustive
    exhaustive_limit: int = 150  # auto: above this many photos, match sequentially (exhaustive is quadratic)
    camera_model: str = "SIMPLE_RADIAL"  # COLMAP's default for unknown phones: focal, center, one radial term
    max_side: int = 1600  # SIFT runs on images at most this large (COLMAP's default is 3200)
    max_num_features: int = 8192  # SIFT features kept per image
    min_registered: float = 0.5  # stop with an error when fewer than this share of the photos (and < 3) register
    force: bool = False  # redo SfM even when a model exists
    num_threads: int = -1  # threads of each stage (-1: every core; 1: the same poses on every run, slower on many cores)
    stage_seconds: dict[str, float] = field(default_factory=dict)  # filled in: seconds per stage


def has_poses(path: Path) -> bool:
    """Whether ``path`` holds a posed format (``lift3d.data.formats``): no structure from motion needed."""
    return formats.detect(path, posed_only=True) is not None


def prepare_capture(path: Path, options: SfmOptions | None = None, video_frames: int = 0) -> Path:
    """The scene folder to reconstruct from ``path``: a video's frames (extracted), a photo folder with poses
    recovered by SfM, or ``path`` itself when it has poses (or nothing lift3d knows: the reader says so)."""
    options = options or SfmOptions()
    if VIDEO.detect(path):
        from lift3d.data.video import extract_frames, frames_folder

        scene = frames_folder(path)
        if options.force or photo_folder(scene) is None:
            extract_frames(path, scene / "images", video_frames)
        if options.matcher == "auto":
            options.matcher = "sequential"
        path = scene
    if not path.is_dir() or (has_poses(path) and not options.force):
        return path
    images = photo_folder(path)
    if images is None:
        return path
    run_sfm(path, images, options)
    return path


def _progress():  # a rich progress bar with elapsed time, shared by the stages
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("lift3d: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False)


def _pycolmap():
    try:
        import pycolmap
    except ImportError:
        raise SceneFormatError("structure from motion needs pycolmap: pip install pycolmap (lift3d installs it by "
                               "default; it ships COLMAP as wheels)") from None
    return pycolmap


def run_sfm(scene: Path, images: Path, options: SfmOptions | None = None) -> Path:
    """Recover the cameras of the photos in ``images`` and write the largest model to ``scene/sparse/0``
    (the COLMAP database stays in ``scene/colmap/``); returns the model folder."""
    pycolmap = _pycolmap()
    if not log.isEnabledFor(logging.DEBUG):
        pycolmap.logging.minloglevel = 3  # COLMAP's own lines only with lift3d -v: lift3d says what went wrong itself
    options = options or SfmOptions()
    if options.matcher not in MATCHERS:
        raise SceneFormatError(f"the matcher must be one of {', '.join(MATCHERS)}, got {options.matcher!r}")
    names = sorted(p.name for p in images.iterdir() if p.suffix in IMAGE_SUFFIXES)
    if len(names) < 2:
        raise SceneFormatError(f"{images} holds {len(names)} photo(s): structure from motion needs at least two "
                               "overlapping photos (better 20 or more, all around the object)")
    photos = [read_photo(images, name) for name in names]  # sizes first: a photo over the pixel limit is refused here
    names = usable_photos(images, names)  # photos cut short and exact copies are left out, by name
    work = scene / "colmap"
    database = work / "database.db"
    sequential = options.matcher == "sequential" or (options.matcher == "auto" and len(names) > options.exhaustive_limit)
    settings = {"camera_model": options.camera_model, "max_side": options.max_side,
                "max_num_features": options.max_num_features}
    resuming = open_work(work, names, settings, options.force)
    log.info("structure from motion on %d photos in %s (pycolmap %s, %s matching)%s", len(names), images,
             pycolmap.__version__, "sequential" if sequential else "exhaustive",
             f"; continuing from {database}" if resuming else "")

    photos = [photo for photo in photos if photo.name in names]
    groups = group_cameras(photos)
    shutil.rmtree(work / "upright", ignore_errors=True)  # an interrupted run's copies: made again
    feed = upright_folder(images, photos, work / "upright")
    log.info("%d camera%s: %s", len(groups), "s" if len(groups) > 1 else "",
             "; ".join(f"{g.describe()} ({len(g.photos)} photo{'s' if len(g.photos) > 1 else ''})" for g in groups))

    pycolmap.set_random_seed(0)  # RANSAC draws: with one thread, the same model every run
    pairing = pycolmap.SequentialPairingOptions()
    pairing.loop_detection = False  # needs a vocabulary tree file, which is a download
    stage = "feature extraction"
    try:
        start = time.perf_counter()
        extraction = pycolmap.FeatureExtractionOptions()
        extraction.num_threads = options.num_threads
        extraction.max_image_size = options.max_side
        extraction.sift.max_num_features = options.max_num_features
        extract_features(pycolmap, database, feed, groups, options.camera_model, extraction, options.num_threads)
        _set_priors(pycolmap, database, groups)
        options.stage_seconds["features"] = time.perf_counter() - start

        stage, start = "matching", time.perf_counter()
        matching = pycolmap.FeatureMatchingOptions()
        matching.num_threads = options.num_threads
        match_pairs(pycolmap, database, work, sequential, matching, pairing)
        options.stage_seconds["matching"] = time.perf_counter() - start

        stage, start = "mapping", time.perf_counter()
        mapping = pycolmap.IncrementalPipelineOptions()
        mapping.random_seed = 0
        mapping.num_threads = options.num_threads
        shutil.rmtree(work / "models", ignore_errors=True)  # an earlier run's partial models
        with Stage("structure from motion: mapping", len(names), "photos registered",
                   every_s=sfm_stages.PROGRESS_EVERY_S) as progress:
            reconstructions = run_stoppable(lambda token: pycolmap.incremental_mapping(
                database, feed, work / "models", mapping, initial_image_pair_callback=lambda: progress.advance(2),
                next_image_callback=lambda: progress.advance(), cancellation_token=token), pycolmap.CancellationToken(),
                progress)
        options.stage_seconds["mapping"] = time.perf_counter() - start
    except KeyboardInterrupt as error:
        if isinstance(error, SfmInterrupted):
            raise
        kept = kept_line(pycolmap, database, names, sequential, pairing)
        mapped = "; the mapping starts again" if stage == "mapping" else ""
        raise SfmInterrupted(f"interrupted during {stage}; kept in {database}: {kept}{mapped}. Run lift3d poses "
                             f"{scene} again to continue from there") from None
    if feed != images:  # upright copies served their purpose (the model names the originals)
        shutil.rmtree(feed, ignore_errors=True)

    best = max(reconstructions.values(), key=lambda r: r.num_reg_images(), default=None)
    registered = {best.image(i).name for i in best.reg_image_ids()} if best is not None else set()
    if len(registered) < max(3, options.min_registered * len(names)):
        raise SceneFormatError(_too_few_message(registered, names, images, database, groups, sequential))
    if len(reconstructions) > 1:
        log.warning("SfM split the photos into %d models; keeping the largest (%d images)", len(reconstructions),
                    len(registered))
    model = scene / "sparse" / "0"
    model.mkdir(parents=True, exist_ok=True)
    best.write(model)
    seconds = ", ".join(f"{k} {v:.1f} s" for k, v in options.stage_seconds.items())
    log.info("registered %d of %d photos, %d points, mean reprojection error %.2f px (%s); model in %s", len(registered),
             len(names), best.num_points3D(), best.compute_mean_reprojection_error(), seconds, model)
    if len(registered) < len(names):
        clauses, _ = describe(explain(names, registered, read_evidence(database), groups), registered, groups)
        log.warning("%d of %d photos did not register and are left out: %s", len(names) - len(registered), len(names),
                    clauses)
    return model


def _set_priors(pycolmap, database: Path, groups: list[CameraGroup]) -> None:
    """Each camera starts from its group's focal length; COLMAP trusts it as a prior only where EXIF gave it
    (two-view geometries are then estimated calibrated, else uncalibrated)."""
    db = pycolmap.Database.open(database)
    for group in groups:
        if group.camera_id < 0:
            continue
        camera = db.read_camera(group.camera_id)
        params = camera.params
        for index in camera.focal_length_idxs():
            params[index] = group.focal_px
        camera.params = params
        camera.has_prior_focal_length = group.from_exif
        db.update_camera(camera)
    db.close()


def _too_few_message(registered: set[str], names: list[str], images: Path, database: Path, groups: list[CameraGroup],
                     sequential: bool) -> str:
    """One line: how many photos registered, why the others did not (from COLMAP's records), and the fix."""
    clauses, fixes = describe(explain(names, registered, read_evidence(database), groups), registered, groups)
    if not clauses:  # every photo registered, and still too few
        clauses, fixes = "too few photos to reconstruct", [REASONS["weak"][1]]
    if sequential and fixes[-1] == REASONS["weak"][1]:  # neighbors only were compared: comparing all may find more
        fixes.append("try --matcher exhaustive (every pair is compared)")
    return (f"structure from motion registered only {len(registered)} of {len(names)} photos in {images}: "
            f"{clauses}. Fix: " + "; ".join(dict.fromkeys(fixes)) + ".")


# --------------------------------------------------------------------------------------------- known poses
_COLMAP_LENS = {"pinhole": ("PINHOLE", 0), "opencv": ("FULL_OPENCV", 8), "fisheye": ("OPENCV_FISHEYE", 4)}


def cache_folder(kind: str, key: str) -> Path:
    """``$XDG_CACHE_HOME/lift3d/<kind>/<key>`` (default ``~/.cache``): derived data stays out of the user's
    scene folder, which may be read-only or shared."""
    import os

    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lift3d" / kind / key


def triangulate_points(capture, max_side: int = 800, max_num_features: int = 2048):
    """Sparse points (and colors) of a capture whose poses are known but that brings no points
    (instant-ngp, most nerfstudio folders): SIFT features, exhaustive matching and COLMAP's triangulation
    at the given poses (one COLMAP camera per distinct lens), cached (``cache_folder``). Returns
    ``(points [P, 3], colors [P, 3] uint8)`` in the capture's world frame, or None when pycolmap is missing
    or fewer than two frames can be used."""
    import hashlib
    import os

    import numpy as np

    from lift3d.data.colmap_model import ColmapCamera, ColmapImage, ColmapModel, write_model_text
    from lift3d.rotations import matrix_to_quaternion_np

    image_dir = Path(os.path.commonpath([str(f.image.parent) for f in capture.frames]))
    names = [f.image.relative_to(image_dir).as_posix() for f in capture.frames]
    photos = [read_photo(image_dir, name) for name in names]
    # frames whose lens describes the image as lift3d loads it (upright): a lens for a resized copy would misplace points
    usable = [(f, n, p) for f, n, p in zip(capture.frames, names, photos) if (p.width, p.height) == (f.lens.width, f.lens.height)]
    if len(usable) < 2:
        log.info("not triangulating sparse points: %d of %d frames have images of their lens's size", len(usable),
                 len(names))
        return None
    frames, names, photos = (list(column) for column in zip(*usable))
    lenses = list(dict.fromkeys(f.lens for f in frames))
    # keyed by what the points depend on: file names and sizes (not times: a copied scene keeps its cache), poses, lenses
    digest = hashlib.sha1(repr((names, [f.image.stat().st_size for f in frames], [f.c2w.round(6).tolist() for f in frames],
                                [lenses.index(f.lens) for f in frames], lenses, max_side,
                                max_num_features)).encode()).hexdigest()[:16]
    folder = cache_folder("triangulated", digest)
    cached = folder / "points.npz"
    if cached.is_file():
        data = np.load(cached)
        log.info("sparse points: %d triangulated at the given poses (cached in %s)", len(data["points"]), folder)
        return data["points"], data["colors"]
    try:
        pycolmap = _pycolmap()
    except SceneFormatError as error:
        log.warning("not triangulating sparse points: %s", error)
        return None
    if not log.isEnabledFor(logging.DEBUG):
        pycolmap.logging.minloglevel = 1
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    database = folder / "database.db"
    feed = upright_folder(image_dir, photos, folder / "upright")  # COLMAP reads pixels as stored; lenses are upright
    start = time.perf_counter()
    with _progress() as progress:
        task = progress.add_task("sparse points", total=len(lenses) + 2)
        extraction = pycolmap.FeatureExtractionOptions()
        extraction.max_image_size, extraction.sift.max_num_features = max_side, max_num_features
        cameras = {}
        for lens in lenses:
            model_name, n_coeffs = _COLMAP_LENS[lens.kind]
            params = [lens.fx, lens.fy, lens.cx, lens.cy, *np.pad(np.asarray(lens.coeffs, float), (0, n_coeffs))[:n_coeffs]]
            reader = pycolmap.ImageReaderOptions()
            reader.camera_model, reader.camera_params = model_name, ",".join(repr(float(v)) for v in params)
            batch = [n for f, n in zip(frames, names) if f.lens == lens]
            pycolmap.extract_features(database, feed, image_names=batch, camera_mode=pycolmap.CameraMode.SINGLE,
                                      reader_options=reader, extraction_options=extraction)
            cameras[lens] = (model_name, np.asarray(params, float))
            progress.advance(task)
        pycolmap.match_exhaustive(database)
        progress.advance(task)
        db = pycolmap.Database.open(database)
        ids = {image.name: (image.image_id, image.camera_id) for image in db.read_all_images()}
        db.close()
        images, colmap_cameras = {}, {}
        for frame, name in zip(frames, names):
            if name not in ids:  # COLMAP could not read it: triangulate from the others
                continue
            image_id, camera_id = ids[name]
            w2c = np.linalg.inv(frame.c2w @ np.diag([1.0, -1.0, -1.0, 1.0]))  # OpenGL c2w -> COLMAP world-to-camera
            images[image_id] = ColmapImage(image_id, matrix_to_quaternion_np(w2c[:3, :3]), w2c[:3, 3], camera_id, name)
            model_name, params = cameras[frame.lens]
            colmap_cameras[camera_id] = ColmapCamera(camera_id, model_name, frame.lens.width, frame.lens.height, params)
        write_model_text(ColmapModel(colmap_cameras, images, {}), folder / "known")
        reconstruction = pycolmap.triangulate_points(pycolmap.Reconstruction(str(folder / "known")), database, feed,
                                                     folder / "triangulated")
        progress.advance(task)
    if feed != image_dir:
        shutil.rmtree(feed, ignore_errors=True)
    points3d = list(reconstruction.points3D.values())
    if not points3d:
        log.warning("triangulation found no sparse points (too little texture or overlap?)")
        return None
    points = np.stack([p.xyz for p in points3d]).astype(np.float32)
    colors = np.stack([p.color for p in points3d]).astype(np.uint8)
    np.savez(cached, points=points, colors=colors)
    log.info("sparse points: %d triangulated at the given poses in %.0f s (mean reprojection error %.2f px), cached in %s",
             len(points), time.perf_counter() - start, reconstruction.compute_mean_reprojection_error(), folder)
    return points, colors
