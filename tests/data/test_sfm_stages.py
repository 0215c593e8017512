"""Structure from motion that reports, stops and resumes (``lift3d.data.sfm_stages``): progress lines per photo and
per pair in a piped log, Ctrl-C during matching ends ``lift3d poses`` within seconds saying what was kept, and the
next run continues from the features and matches in COLMAP's database. On generated photos (the sample toy on a
textured floor) and on a subset of the fox capture's phone photos."""

from __future__ import annotations

import _thread
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

from lift3d.cli import main
from lift3d.data import sfm_stages
from lift3d.data.sfm_stages import STATE_FILE, open_work, run_stoppable
from tests.conftest import REPO
from tests.sfm_scene import write_photos


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C as a terminal gives it, also where this suite was started in the background (which ignores SIGINT, and
    processes inherit that)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _ctrl_c_as_in_a_terminal() -> None:
    """In a child before it starts Python: SIGINT back to its default, so Python turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Token:
    """A stand-in for pycolmap's CancellationToken."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()


def test_ctrl_c_while_a_call_runs_cancels_it_at_once():
    token = _Token()
    threading.Timer(0.3, _thread.interrupt_main).start()  # Ctrl-C, as the terminal delivers it, to the main thread
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_stoppable(lambda t: t.cancelled.wait(30), token)  # a call that runs until it is cancelled
    assert token.cancelled.is_set() and time.monotonic() - start < 2.0


def test_a_call_error_reaches_the_caller_and_results_come_back():
    assert run_stoppable(lambda t: 42, _Token()) == 42
    with pytest.raises(ValueError, match="bad photo"):
        run_stoppable(lambda t: (_ for _ in ()).throw(ValueError("bad photo")), _Token())


def test_work_resumes_only_for_the_same_photos_and_settings(tmp_path):
    work = tmp_path / "colmap"
    assert not open_work(work, ["a.jpg", "b.jpg"], {"max_side": 1600}, force=False)
    (work / "database.db").write_bytes(b"kept")
    assert open_work(work, ["a.jpg", "b.jpg"], {"max_side": 1600}, force=False)
    assert (work / "database.db").read_bytes() == b"kept"
    assert not open_work(work, ["a.jpg", "b.jpg", "c.jpg"], {"max_side": 1600}, force=False)  # another photo set
    assert not (work / "database.db").exists() and (work / STATE_FILE).is_file()
    (work / "database.db").write_bytes(b"kept")
    assert not open_work(work, ["a.jpg", "b.jpg", "c.jpg"], {"max_side": 800}, force=False)  # other features
    (work / "database.db").write_bytes(b"kept")
    assert not open_work(work, ["a.jpg", "b.jpg", "c.jpg"], {"max_side": 800}, force=True)  # --force starts over


def _counts(lines: list[str], what: str) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(rf"{what}: (\d+)/\d+ ", line))]


def test_a_piped_log_shows_each_photo_and_pair_and_a_rerun_reuses_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sfm_stages, "PROGRESS_EVERY_S", 0.0)  # a line at every step instead of every ten seconds
    write_photos(tmp_path / "images", n_views=8, resolution=200)
    assert main(["poses", str(tmp_path)]) == 0
    lines = capsys.readouterr().err.splitlines()  # captured: not a terminal, as a log piped to a file
    features, pairs = _counts(lines, "features"), _counts(lines, "matching")
    assert features == sorted(features) and features[-1] >= 6  # photo by photo
    assert pairs == sorted(pairs) and len(set(pairs)) >= 3  # pair by pair, in several calls
    assert any("pairs" in line and "left" in line for line in lines)  # with the time left
    assert (tmp_path / "sparse" / "0").is_dir()
    # the model is gone, the database stays: the next run uses its features and matches
    (tmp_path / "sparse" / "0" / "cameras.bin").unlink()
    assert main(["poses", str(tmp_path)]) == 0
    again = capsys.readouterr().err
    assert "8 of 8 photos already have theirs" in again and "28 of 28 pairs already matched" in again
    assert not _counts(again.splitlines(), "features")[1:] and (tmp_path / "sparse" / "0" / "cameras.bin").is_file()


def _fox_subset(data_dir: Path, folder: Path, count: int = 8, max_side: int = 960) -> Path:
    """``count`` consecutive photos of the fox capture, scaled to ``max_side`` (as a phone's smaller export is)."""
    (folder / "images").mkdir(parents=True)
    for path in sorted((data_dir / "fox" / "images").glob("*.jpg"))[:count]:
        with Image.open(path) as photo:
            photo.thumbnail((max_side, max_side))
            photo.save(folder / "images" / path.name, quality=92)
    return folder


def test_ctrl_c_during_matching_ends_within_seconds_and_the_next_run_continues(data_dir, tmp_path, capsys):
    scene = _fox_subset(data_dir, tmp_path / "fox")
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "lift3d", "poses", str(scene)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
                               preexec_fn=_ctrl_c_as_in_a_terminal)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 600
    while not any("structure from motion: matching (" in line for line in lines) and process.poll() is None:
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)
    time.sleep(0.5)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    code = process.wait(30)
    took = time.monotonic() - sent
    reader.join(5)
    assert code == 130 and took < 5.0, (code, took, lines[-3:])
    last = lines[-1]
    assert "interrupted during matching" in last and "features of 8 of 8 photos" in last, lines[-3:]
    assert re.search(r"\d+ of 28 pairs matched", last) and "again to continue" in last
    assert main(["poses", str(scene)]) == 0  # continued: features reused, the rest matched, mapped
    again = capsys.readouterr().err
    assert "8 of 8 photos already have theirs" in again and (scene / "sparse" / "0").is_dir()
    assert not _counts(again.splitlines(), "features")[1:]
