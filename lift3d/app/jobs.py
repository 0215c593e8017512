"""A queue of ``lift3d train`` runs in subprocesses, one at a time per GPU (one at a time on CPU).

Each run is followed through its ``progress.json`` (step, loss, ETA, latest grid, status). Cancelling sends
SIGINT (then SIGTERM, then SIGKILL after a grace period); checkpoints are written atomically, so what was
written stays, and the job's note names the checkpoint it kept (read from ``ckpts/``) or says there is none.
When training ends, ``lift3d export`` writes the recipe's assets from the last checkpoint. Job state lives
here, server-side; each job records the page session (``owner``) that started it, for the page to scope by.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lift3d.app.recipes import quote
from lift3d.app.results import Results, describe_kept, error_from_log, result_files
from lift3d.progress import read_progress
from lift3d.runs.run_dirs import FAILED_DIR, current_location

log = logging.getLogger("lift3d")

QUEUED, RUNNING, EXPORTING = "queued", "running", "exporting"
FINISHED, FAILED, CANCELLED = "finished", "failed", "canceled"
ACTIVE = (QUEUED, RUNNING, EXPORTING)

def default_slots() -> list[str]:
    """One slot per visible GPU (``cuda:0`` ...), or a single ``cpu`` slot."""
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # a broken CUDA set-up still runs on CPU
        count = 0
    return [f"cuda:{i}" for i in range(count)] or ["cpu"]


@dataclass
class JobSpec:
    """What to run: a config with overrides, written under ``output_root``."""

    config: Path  # the recipe YAML
    overrides: list[str]  # dotlist overrides (the prompt or scene and the page's options)
    output_root: Path  # runs go to <output_root>/<name>/<tag>@<time>/
    recipe: str = ""  # friendly recipe name, for display
    title: str = ""  # the prompt or the scene, for display and the run tag
    export: bool = True  # run `lift3d export` after training
    export_formats: list[str] | None = None  # `--format` list (None: the recipe's own)
    poses_from: str = ""  # photos or a video to run `lift3d poses` on before training (structure from motion)
    edit_of: str = ""  # a finished reconstruction's run folder: run `lift3d edit` on it, the title as the instruction
    editor: str = "instruct-pix2pix"  # with edit_of: `lift3d edit --editor` (instruct-pix2pix or analytic)
    owner: str = ""  # the page session that started it (a secret token); the page shows the job only to it
    method: str = ""  # a method of the method table: run through lift3d reconstruct / generate (every stage) ...
    task: str = ""  # ... of this task (photos, text, image) ...
    input: str = ""  # ... on this input (the scene folder, the prompt or the photo) ...
    prompt: str = ""  # ... with this prompt beside a photo (methods that take one)


def job_command(spec: JobSpec) -> list[str]:
    """The ``lift3d`` command (before the overrides) of a job: an edit of a finished run, a method of the method table
    through its front end (every stage, the variant that fits this machine), or one recipe file."""
    if spec.edit_of:  # the app made the run it edits (from its operator's recipes), so that run's plugins may load
        return ["edit", spec.edit_of, spec.title, "--editor", spec.editor, "--allow-imports"]
    if spec.method and spec.task == "photos":
        return ["reconstruct", spec.input, "--method", spec.method]
    if spec.method and spec.task == "image":
        return ["generate", *([spec.prompt] if spec.prompt else []), "--image", spec.input, "--method", spec.method,
                "--refine-set", "trainer.enable_progress_bar=false"]
    if spec.method:
        return ["generate", spec.input, "--method", spec.method, "--refine-set", "trainer.enable_progress_bar=false"]
    return ["train", str(spec.config)]


def _slug(text: str, limit: int = 40) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "run"


@dataclass
class Job:
    """One run and what is known about it; updated by the worker thread, read by the page."""

    id: str
    spec: JobSpec
    tag: str  # the run tag: <output_root>/<name>/<tag>@<time>/
    state: str = QUEUED
    device: str | None = None  # the slot it ran on (cuda:N or cpu)
    run_dir: Path | None = None
    progress: dict[str, Any] = field(default_factory=dict)  # the run's last progress.json record
    error: str | None = None  # why it failed
    note: str | None = None  # a remark: the cancel point, an export that failed
    created: float = field(default_factory=time.time)
    started: float | None = None
    ended: float | None = None
    log_path: Path | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def results(self) -> Results:
        return result_files(self.run_dir)


class JobQueue:
    """Runs jobs in subprocesses, one per slot at a time, first come first served."""

    def __init__(self, slots: list[str] | None = None, *, python: str | None = None, poll_s: float = 0.5,
                 cancel_grace_s: float = 30.0, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.slots = list(slots or default_slots())
        self.python = python or sys.executable
        self.poll_s = poll_s
        self.cancel_grace_s = cancel_grace_s
        self.env = env
        self.cwd = cwd
        self._cond = threading.Condition()
        self._pending: deque[Job] = deque()
        self._jobs: dict[str, Job] = {}
        self._closed = False
        self._threads = [threading.Thread(target=self._worker, args=(slot,), name=f"lift3d-job-{slot}", daemon=True)
                         for slot in self.slots]
        for thread in self._threads:
            thread.start()

    # ----------------------------------------------------------------------------------- the page's calls
    def submit(self, spec: JobSpec) -> Job:
        """Queue a run; it starts when a slot is free."""
        job_id = uuid.uuid4().hex[:10]
        job = Job(job_id, spec, tag=f"{_slug(spec.title)}-{job_id}")
        with self._cond:
            if self._closed:
                raise RuntimeError("the job queue is closed")
            self._jobs[job_id] = job
            self._pending.append(job)
            self._cond.notify_all()
        log.info("job %s queued: %s %s", job_id, spec.recipe or spec.config, spec.title)
        return job

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued job, or interrupt a running one (its last checkpoint stays); False if not active."""
        with self._cond:
            job = self._jobs.get(job_id)
            if job is None or not job.active:
                return False
            job.cancel_event.set()
            if job.state == QUEUED:
                self._pending.remove(job)
                job.state, job.ended, job.note = CANCELLED, time.time(), "canceled before it started"
            self._cond.notify_all()
        return True

    def get(self, job_id: str | None) -> Job | None:
        return self._jobs.get(job_id) if job_id else None

    def jobs(self) -> list[Job]:
        """Every job, oldest first."""
        with self._cond:
            return list(self._jobs.values())

    def latest(self, active_only: bool = False) -> Job | None:
        """The newest job that is running or queued (or, unless ``active_only``, the newest of all)."""
        jobs = self.jobs()
        running = [j for j in jobs if j.state in (RUNNING, EXPORTING)]
        queued = [j for j in jobs if j.state == QUEUED]
        if running or queued:
            return (running or queued)[-1]
        return None if active_only or not jobs else jobs[-1]

    def position(self, job: Job) -> int:
        """1-based place of a queued job in the queue; 0 when it is not queued."""
        with self._cond:
            return next((i + 1 for i, j in enumerate(self._pending) if j is job), 0)

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job is done (or ``timeout`` seconds pass); return it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            job = self._jobs[job_id]
            while job.active or job.ended is None:  # ended is set last, once the job is wholly done
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(0.2 if left is None else min(left, 0.2))
        return job

    def close(self, timeout: float = 60.0) -> None:
        """Cancel everything (running jobs keep their last checkpoint) and stop the workers."""
        with self._cond:
            self._closed = True
            active = [j.id for j in self._jobs.values() if j.active]
        for job_id in active:
            self.cancel(job_id)
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.0))

    # ----------------------------------------------------------------------------------- the workers
    def _worker(self, slot: str) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                job = self._pending.popleft()
                job.state, job.device, job.started = RUNNING, slot, time.time()
            try:
                self._run(job, slot)
            except Exception as error:  # a bug here must not kill the worker: the job fails, the queue goes on
                log.exception("job %s failed inside the app", job.id)
                job.state, job.error = FAILED, f"the app could not run the job: {type(error).__name__}: {error}"
            finally:
                with self._cond:
                    job.ended = time.time()
                    self._cond.notify_all()
            log.info("job %s %s%s", job.id, job.state, f": {job.error}" if job.error else "")

    def _env(self, slot: str) -> dict[str, str]:
        env = dict(self.env if self.env is not None else os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if slot.startswith("cuda:"):
            index = int(slot.split(":", 1)[1])
            visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
            env["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
        return env

    def _log_path(self, job: Job, stage: str) -> Path:
        folder = job.spec.output_root / "app-logs"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{job.tag}-{stage}.log"

    def _find_run(self, job: Job) -> Path | None:
        root = job.spec.output_root
        patterns = [f"{aside}*/{job.tag}{at}" for aside in ("", f"{FAILED_DIR}/") for at in ("", "@*")]  # failed: aside
        found = [p for pattern in patterns for p in root.glob(pattern) if p.is_dir()]
        return max(found, key=lambda p: p.stat().st_mtime) if found else None

    def _refresh(self, job: Job) -> None:
        if job.run_dir is None:
            job.run_dir = self._find_run(job)
        if job.run_dir is not None:
            job.run_dir = current_location(job.run_dir)  # a run that failed is set aside (lift3d.runs.run_dirs)
            job.progress = read_progress(job.run_dir) or job.progress

    def _follow(self, job: Job, command: list[str], log_path: Path, slot: str) -> int:
        """Run ``command``, refreshing the job's progress; on cancel signal INT, then TERM, then KILL."""
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=self._env(slot), cwd=self.cwd, start_new_session=True)
            signals = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
            last_signal = 0.0
            while True:
                try:
                    code = process.wait(timeout=self.poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                self._refresh(job)
                grace = self.cancel_grace_s if last_signal else 0
                if job.cancel_event.is_set() and signals and time.monotonic() - last_signal > grace:
                    sig = signals.pop(0)
                    log.info("job %s: sending %s", job.id, sig.name)
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, sig)
                    last_signal = time.monotonic()
        self._refresh(job)
        return code

    def _lift3d(self, *args: str) -> list[str]:
        return [self.python, "-m", "lift3d", *args]

    def _run(self, job: Job, slot: str) -> None:
        spec = job.spec
        if spec.poses_from and not self._poses(job, slot):
            return
        job.log_path = self._log_path(job, "train")
        command = self._lift3d(*job_command(spec), *spec.overrides, f"output_root={quote(str(spec.output_root))}",
                               f"tag={job.tag}", "trainer.enable_progress_bar=false")
        code = self._follow(job, command, job.log_path, slot)
        status = job.progress.get("status")
        if job.cancel_event.is_set():
            self._canceled(job)
            return
        if code != 0 or status == "failed":
            job.state = FAILED
            job.error = (job.progress.get("error") if status == "failed" else None) or error_from_log(job.log_path) \
                or f"the run exited with code {code}"
            return
        if spec.export:
            self._export(job, slot)
        if job.cancel_event.is_set():
            self._canceled(job)
            return
        job.state = FINISHED

    def _poses(self, job: Job, slot: str) -> bool:
        """Structure from motion before training; False (the job failed or was canceled) when it did not work."""
        job.log_path = self._log_path(job, "poses")
        code = self._follow(job, self._lift3d("poses", job.spec.poses_from), job.log_path, slot)
        if job.cancel_event.is_set():
            self._canceled(job)
            return False
        if code != 0:
            job.state = FAILED
            job.error = error_from_log(job.log_path) or f"structure from motion exited with code {code}"
            return False
        return True

    def _export(self, job: Job, slot: str) -> None:
        checkpoint = job.run_dir / "ckpts" / "last.ckpt" if job.run_dir else None
        if checkpoint is None or not checkpoint.is_file():
            job.note = "training finished without a last checkpoint, so nothing was exported"
            return
        job.state = EXPORTING
        formats = ["--format", *job.spec.export_formats] if job.spec.export_formats else []
        command = self._lift3d("export", str(job.run_dir / "configs" / "parsed.yaml"), "--resume", str(checkpoint), *formats,
                               "--allow-imports")  # the app's own run, from its operator's recipe: its plugins may load
        export_log = self._log_path(job, "export")
        if self._follow(job, command, export_log, slot) != 0 and not job.cancel_event.is_set():
            job.note = f"training finished, but the export failed: {error_from_log(export_log)}"

    def _canceled(self, job: Job) -> None:
        """Mark the job canceled, its note saying at which step and what it kept (read from its ckpts/)."""
        self._refresh(job)
        step = job.progress.get("step")
        job.note = f"canceled{f' at step {step}' if step is not None else ''}; {describe_kept(job.run_dir, step)}"
        job.state = CANCELLED
