"""Structure from motion's stages run so that they report, stop and resume: features photo by photo, matching in
chunks of image pairs (with the time left), each pycolmap call in a worker thread while the main thread waits, so
Ctrl-C is answered at once (pycolmap's cancellation token stops the call within a few seconds).

Everything a stage finishes is in COLMAP's database (``colmap/database.db`` beside the photos), next to
``sfm-state.json`` (the photos and feature settings it was made with): a run interrupted there, or one that
failed, is continued by the next run of the same photos with the same settings, which extracts features only for
photos without them and matches only pairs not yet matched.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lift3d.progress import Stage

log = logging.getLogger("lift3d.sfm")
STATE_FILE = "sfm-state.json"
STOP_WAIT_S = 2.0  # after Ctrl-C, how long a cancelled pycolmap call may take to return before lift3d leaves it
WORKER = "lift3d-sfm"  # the worker thread's name
CHUNK_SECONDS = 3.0  # matching: each call matches about this many seconds' worth of pairs
POLL_S = 0.25  # how often the waiting main thread wakes (for Ctrl-C and the progress lines)
PROGRESS_EVERY_S = 10.0  # a progress line at least this often while a stage runs


class SfmInterrupted(KeyboardInterrupt):
    """Structure from motion stopped by Ctrl-C: ``lift3d`` exits 130 with this one line (what was kept, how to go on),
    at once (``exit_now``): not waiting for a cancelled pycolmap call still finishing its pair in the worker thread,
    nor for the interpreter's clean-up of torch and friends (what COLMAP writes is in SQLite transactions: one left
    unfinished is rolled back)."""

    exit_code = 130
    exit_now = True

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line

    def __str__(self) -> str:
        return self.line


def run_stoppable(call: Callable[[Any], Any], token: Any, stage: Stage | None = None) -> Any:
    """``call(token)`` in a worker thread while this thread waits, logging ``stage``'s progress line every ten
    seconds; on Ctrl-C it cancels ``token`` (a ``pycolmap.CancellationToken``), waits up to STOP_WAIT_S for the call
    to return, and raises the KeyboardInterrupt. The call's own error is raised here. The worker is not a daemon:
    the interpreter waits for a cancelled call to return before it exits (a daemon thread coming back from
    COLMAP's C++ into a finalizing interpreter aborts the process)."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call(token)
        except BaseException as error:  # noqa: BLE001  (handed to the waiting thread)
            outcome["error"] = error

    worker = threading.Thread(target=work, name=WORKER)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(POLL_S)
            if stage is not None:
                stage.advance(0)  # a line every ten seconds, even while one call runs long
    except KeyboardInterrupt:
        token.cancel()
        worker.join(STOP_WAIT_S)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def open_work(work: Path, names: list[str], settings: dict[str, Any], force: bool) -> bool:
    """Make ``work`` (the ``colmap/`` folder) ready: keep it when its state file records the same photos and
    settings (and ``force`` is off), so the run resumes; else start it empty. Returns whether it resumes."""
    state = {"photos": names, "settings": settings}
    path = work / STATE_FILE
    try:
        resumable = not force and (work / "database.db").is_file() and json.loads(path.read_text()) == state
    except (OSError, ValueError):
        resumable = False
    if not resumable and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state))
    return resumable


def _threads(num_threads: int) -> int:
    return num_threads if num_threads > 0 else max(1, os.cpu_count() or 1)


def extracted(pycolmap, database: Path) -> dict[str, int]:
    """Image name -> its COLMAP camera id, for every photo the database holds features of."""
    if not database.is_file():
        return {}
    db = pycolmap.Database.open(database)
    try:
        return {image.name: image.camera_id for image in db.read_all_images() if db.exists_keypoints(image.image_id)
                and db.exists_descriptors(image.image_id)}
    finally:
        db.close()


def extract_features(pycolmap, database: Path, feed: Path, groups: list, camera_model: str, extraction,
                     num_threads: int) -> None:
    """SIFT features of every photo that has none yet, a few photos per call (as many as threads run: the progress
    line moves photo by photo, and Ctrl-C stops between or inside calls), one COLMAP camera per group."""
    done = extracted(pycolmap, database)
    todo = [(group, [n for n in group.names if n not in done]) for group in groups]
    total = sum(len(group.names) for group in groups)
    if done:
        log.info("features: %d of %d photos already have theirs (in %s)", len(done), total, database)
    per_call = min(8, _threads(num_threads))
    with Stage("structure from motion: features", total, "photos", every_s=PROGRESS_EVERY_S) as stage:
        stage.done = len(done)
        for group, names in todo:
            reader = pycolmap.ImageReaderOptions()
            reader.camera_model = camera_model
            known = [done[n] for n in group.names if n in done]
            if known:  # the camera made by an earlier run: the rest of the group joins it
                group.camera_id = reader.existing_camera_id = known[0]
            for start in range(0, len(names), per_call):
                batch = names[start:start + per_call]
                run_stoppable(lambda token, batch=batch, reader=reader: pycolmap.extract_features(
                    database, feed, image_names=batch, camera_mode=pycolmap.CameraMode.SINGLE, reader_options=reader,
                    extraction_options=extraction, cancellation_token=token), pycolmap.CancellationToken(), stage)
                if group.camera_id < 0:  # the first call made the camera: later calls join it
                    ids = extracted(pycolmap, database)
                    camera = next((ids[n] for n in batch if n in ids), None)
                    if camera is not None:
                        group.camera_id = reader.existing_camera_id = camera
                stage.advance(len(batch))


def image_pairs(pycolmap, database: Path, sequential: bool, pairing) -> tuple[list[tuple[str, str]], int]:
    """(the pairs of photo names still to match, how many pairs there are in all): COLMAP's exhaustive or
    sequential pairs of the photos in the database, less those already matched (a two-view geometry recorded)."""
    db = pycolmap.Database.open(database)
    try:
        names = {image.image_id: image.name for image in db.read_all_images()}
        generator = (pycolmap.SequentialPairGenerator(pairing, db) if sequential
                     else pycolmap.ExhaustivePairGenerator(pycolmap.ExhaustivePairingOptions(), db))
        pairs = generator.all_pairs()
        todo = [(names[a], names[b]) for a, b in pairs if not db.exists_two_view_geometry(a, b)]
    finally:
        db.close()
    return todo, len(pairs)


def matched(pycolmap, database: Path, sequential: bool, pairing) -> tuple[int, int]:
    """(pairs matched, pairs in all) of the database."""
    todo, total = image_pairs(pycolmap, database, sequential, pairing)
    return total - len(todo), total


def match_pairs(pycolmap, database: Path, work: Path, sequential: bool, matching, pairing) -> None:
    """Match (and geometrically verify) every pair not yet matched, in chunks sized to take about CHUNK_SECONDS,
    with a progress line (pairs matched of all, time left) every ten seconds."""
    todo, total = image_pairs(pycolmap, database, sequential, pairing)
    if total > len(todo):
        log.info("matching: %d of %d pairs already matched (in %s)", total - len(todo), total, database)
    pairs_file = work / "pairs.txt"
    chunk, start = max(2, 2 * _threads(matching.num_threads)), 0
    with Stage("structure from motion: matching", total, "pairs", every_s=PROGRESS_EVERY_S) as stage:
        stage.done = total - len(todo)
        while start < len(todo):
            batch = todo[start:start + chunk]
            pairs_file.write_text("".join(f"{a} {b}\n" for a, b in batch))
            options = pycolmap.ImportedPairingOptions()
            options.match_list_path = pairs_file
            began = time.monotonic()
            run_stoppable(lambda token, options=options: pycolmap.match_image_pairs(
                database, matching_options=matching, pairing_options=options, cancellation_token=token),
                pycolmap.CancellationToken(), stage)
            seconds = max(time.monotonic() - began, 1e-3)
            stage.advance(len(batch))
            start += len(batch)
            chunk = int(min(max(2, len(batch) * CHUNK_SECONDS / seconds), 4 * len(batch), 500))
    pairs_file.unlink(missing_ok=True)


def kept_line(pycolmap, database: Path, names: list[str], sequential: bool, pairing) -> str:
    """What the database holds, for the interrupted message: features of how many photos, pairs matched."""
    try:
        features = len(extracted(pycolmap, database))
        pairs = ""
        if features == len(names):
            done, total = matched(pycolmap, database, sequential, pairing)
            pairs = f", {done} of {total} pairs matched"
        return f"features of {features} of {len(names)} photos{pairs}"
    except Exception as error:  # noqa: BLE001  (the database may be mid-write: say so rather than fail)
        return f"what it holds could not be read ({type(error).__name__})"
