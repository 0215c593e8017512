"""What the page shows for a job, as plain data and HTML (no gradio here, so it is tested directly)."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from lift3d.app.jobs import CANCELLED, EXPORTING, FAILED, FINISHED, QUEUED, RUNNING, Job
from lift3d.app.results import Results

_HEADLINES = {
    QUEUED: "Queued",
    RUNNING: "Training",
    EXPORTING: "Exporting the result",
    FINISHED: "Finished",
    FAILED: "Failed",
    CANCELLED: "Cancelled",
}


def format_duration(seconds: float | None) -> str:
    """``75`` -> ``1:15``; ``3725`` -> ``1:02:05``; unknown -> ``--:--``."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass(frozen=True)
class JobView:
    """One job as the page shows it."""

    job_id: str
    state: str
    headline: str  # e.g. "Training on cpu: a red apple"
    step: int
    max_steps: int | None
    stats: str  # "step 12 / 60 · loss 0.0123 · 14.2 steps/s · ETA 0:03"
    error: str | None
    note: str | None
    latest_image: str | None  # the newest validation grid

    @property
    def fraction(self) -> float:
        return min(max(self.step / self.max_steps, 0.0), 1.0) if self.max_steps else 0.0


def job_view(job: Job, queue_position: int = 0) -> JobView:
    """The job's state, progress numbers and messages for the page."""
    progress = job.progress
    step = int(progress.get("step") or 0)
    max_steps = progress.get("max_steps")
    parts = [f"step {step} / {max_steps}" if max_steps else f"step {step}"]
    if progress.get("loss") is not None:
        parts.append(f"loss {progress['loss']:.4g}")
    if job.state == RUNNING and progress.get("steps_per_second"):
        parts.append(f"{progress['steps_per_second']:.3g} steps/s")
        parts.append(f"ETA {format_duration(progress.get('eta_seconds'))}")
    if job.state == QUEUED:
        parts = [f"position {queue_position} in the queue" if queue_position else "waiting for a free device"]
    headline = _HEADLINES.get(job.state, job.state)
    if job.state in (RUNNING, EXPORTING) and job.device:
        headline += f" on {job.device}"
    if job.spec.title:
        headline += f": {job.spec.title}"
    image = progress.get("latest_image")
    return JobView(job.id, job.state, headline, step, max_steps, " · ".join(parts), job.error, job.note,
                   image if image and Path(image).is_file() else None)


def status_html(view: JobView | None) -> str:
    """The progress panel: headline, progress bar, numbers, and the error or note."""
    if view is None:
        return ('<div id="lift3d-status" class="lift3d-status" data-state="idle" data-step="0">'
                '<div class="lift3d-headline">No run yet: choose a recipe, give it a prompt or photos, and press Start.'
                '</div></div>')
    percent = 100.0 * view.fraction
    lines = [
        f'<div id="lift3d-status" class="lift3d-status state-{view.state}" data-job="{view.job_id}" '
        f'data-state="{view.state}" data-step="{view.step}" data-max-steps="{view.max_steps or 0}">',
        f'<div class="lift3d-headline">{html.escape(view.headline)}</div>',
        f'<progress class="lift3d-bar" max="100" value="{percent:.1f}">{percent:.0f}%</progress>',
        f'<div class="lift3d-stats">{html.escape(view.stats)}</div>',
    ]
    if view.error:
        lines.append(f'<div class="lift3d-error">{html.escape(view.error)}</div>')
    if view.note:
        lines.append(f'<div class="lift3d-note">{html.escape(view.note)}</div>')
    lines.append("</div>")
    return "".join(lines)


def message_html(text: str, kind: str = "info") -> str:
    """A one-line message under the Start button (``kind``: info or error)."""
    if not text:
        return ""
    return f'<div id="lift3d-message" class="lift3d-message lift3d-{kind}" data-kind="{kind}">{html.escape(text)}</div>'


def result_values(results: Results) -> tuple[str | None, str | None, list[str]]:
    """(3D viewer file, orbit video, download list) as strings for the page's components."""
    return (str(results.model) if results.model else None, str(results.video) if results.video else None,
            [str(p) for p in results.files])


# Browsers may offer WebGPU with no adapter behind it (headless or GPU-blocklisted Chrome); the 3D viewer of gradio
# before 6.31 (Babylon.js) then fails and the page stops drawing results. Hiding navigator.gpu when no adapter comes
# makes it use WebGL, which such browsers still have.
HEAD = """<script>
if (navigator.gpu) {
  navigator.gpu.requestAdapter().then((adapter) => { if (!adapter) delete Navigator.prototype.gpu; },
                                      () => { delete Navigator.prototype.gpu; });
}
</script>"""

CSS = """
.lift3d-status { padding: 0.6em 0.8em; border-radius: 8px; border: 1px solid var(--border-color-primary); }
.lift3d-headline { font-weight: 600; margin-bottom: 0.4em; }
.lift3d-bar { width: 100%; height: 14px; accent-color: var(--color-accent); }
.lift3d-stats { font-family: var(--font-mono); font-size: 0.9em; margin-top: 0.3em; }
.lift3d-error, .lift3d-message.lift3d-error { color: var(--error-text-color, #b91c1c); font-weight: 600; margin-top: 0.4em; }
.lift3d-note { opacity: 0.8; margin-top: 0.3em; }
.lift3d-message { padding: 0.4em 0; }
"""
