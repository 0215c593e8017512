"""Run folders: where a run writes, which run a checkpoint belongs to, and a trained system loaded back.

Below both the runner and the viewer (and the commands that export or view a finished run), so none of them
has to import another to find a run's files.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lift3d.checkpoints import load_checkpoint
from lift3d.config import ConfigError, ExperimentConfig, to_yaml
from lift3d.data.sample_scene import asset_name
from lift3d.progress import read_progress, update_progress
from lift3d.registry import find
from lift3d.saving import OutputSaver

if TYPE_CHECKING:
    import torch

RUN_DIR_ENV = "LIFT3D_RUN_DIR"  # rank 0's run folder, read by the DDP ranks Lightning starts (they re-run the command)


def run_dir_name(cfg: ExperimentConfig) -> Path:
    """``<output_root>/<name>/<tag>@<timestamp>/`` (without the timestamp when use_timestamp is off), not created."""
    tag = (cfg.tag or "run").replace("/", "_").replace(" ", "_")[:80]
    if cfg.use_timestamp:
        tag = f"{tag}@{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output_root) / cfg.name / tag


def make_run_dir(cfg: ExperimentConfig) -> Path:
    """Create and return the folder of ``run_dir_name``, exclusively: when another run has it (started in the same
    second, or the same tag without timestamps) this run takes ``<folder>-1``, ``-2``, ..., never a shared one."""
    base = run_dir_name(cfg)
    parent, tag = base.parent, base.name
    parent.mkdir(parents=True, exist_ok=True)
    for suffix in range(10_000):
        candidate = parent / (tag if suffix == 0 else f"{tag}-{suffix}")
        try:
            candidate.mkdir(exist_ok=False)
            return candidate
        except FileExistsError:
            continue
    raise ConfigError(f"{parent} holds 10000 runs tagged {tag!r}: give this run another tag= or output_root=")


FAILED_DIR = ".failed"  # <output_root>/.failed/<name>/<run>: new runs that failed before writing a checkpoint


def is_failed(run_dir: Path) -> bool:
    """Whether the run's progress.json says it failed (finders of "the newest run" skip such runs)."""
    return (read_progress(run_dir) or {}).get("status") == "failed"


def set_aside_failed(run_dir: Path, error: BaseException) -> Path:
    """Mark a new run that failed: its error goes into progress.json (status failed), and a run with no checkpoint
    (nothing to resume: a model that would not load, bad data) moves to ``<output_root>/.failed/<name>/<run>``,
    out of the way of the good runs. One with a checkpoint stays (``--resume`` continues it), marked failed.
    Returns where the run is now; a failure to move leaves it in place."""
    log = logging.getLogger("lift3d")
    try:
        if (read_progress(run_dir) or {}).get("status") != "failed":  # the training callback records its own errors
            update_progress(run_dir, status="failed", error=f"{type(error).__name__}: {error}".strip())
        if not run_dir.is_dir() or any((run_dir / "ckpts").glob("*.ckpt")):
            return run_dir
        target = _aside(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        candidate = next(path for path in _aside_names(target) if not path.exists())
        run_dir.rename(candidate)
        update_progress(candidate, run_dir=str(candidate))
    except Exception:  # noqa: BLE001  (setting a run aside never hides the error that failed it)
        log.debug("could not set the failed run %s aside", run_dir, exc_info=True)
        return run_dir
    log.info("the failed run's folder (its configs, logs and the error in progress.json) is set aside in %s", candidate)
    return candidate


def _aside(run_dir: Path) -> Path:
    return run_dir.parent.parent / FAILED_DIR / run_dir.parent.name / run_dir.name


def _aside_names(target: Path) -> list[Path]:
    return [target, *(target.with_name(f"{target.name}-{n}") for n in range(1, 1000))]


def current_location(run_dir: Path) -> Path:
    """Where a run folder is now: itself, or where ``set_aside_failed`` moved it (for those that follow a run by its
    folder, as the app does)."""
    if run_dir.exists():
        return run_dir
    for candidate in _aside_names(_aside(run_dir))[:20]:  # the one that records it came from run_dir's place
        record = read_progress(candidate) or {}
        if record.get("status") == "failed" and record.get("run_dir") == str(candidate) and candidate.is_dir():
            return candidate
    return run_dir


def run_dir_of_checkpoint(path: str | Path) -> Path | None:
    """The run folder a checkpoint lives in (``<run>/ckpts/x.ckpt``), if it does."""
    path = Path(path).resolve()
    if path.parent.name == "ckpts" and (path.parent.parent / "configs").is_dir():
        return path.parent.parent
    return None


def write_configs(run_dir: Path, cfg: ExperimentConfig, config_paths: Sequence[str | Path], overrides: Sequence[str]) -> None:
    """``configs/``: the parsed config, copies of the YAML files it came from, and the overrides (if any)."""
    configs = run_dir / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    OutputSaver(configs).text("parsed.yaml", to_yaml(with_asset_names(to_container(cfg))))
    for path in config_paths:
        target = configs / Path(path).name
        if Path(path).resolve() != target.resolve():  # resuming from the run's own configs/parsed.yaml
            shutil.copyfile(path, target)
    if overrides:
        OutputSaver(configs).text("overrides.txt", "\n".join(overrides) + "\n")


def to_container(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as plain data, interpolations kept as written."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=False)  # type: ignore[return-value]


def with_asset_names(tree: Any) -> Any:
    """``tree`` with every path into the package's assets written as its resource name (``lift3d:sample_scene``), so
    a finished run's parsed.yaml still loads after lift3d is reinstalled elsewhere (the data layer resolves it)."""
    if isinstance(tree, dict):
        return {key: with_asset_names(value) for key, value in tree.items()}
    if isinstance(tree, list):
        return [with_asset_names(value) for value in tree]
    if isinstance(tree, str) and ("/" in tree or "\\" in tree):
        return asset_name(tree) or tree
    return tree


def process_rank() -> int:
    """This process's global rank as the launcher set it (0 outside DDP)."""
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def shared_run_dir() -> Path | None:
    """In a DDP rank other than 0: the run folder rank 0 chose (its timestamp may differ from ours)."""
    if process_rank() > 0 and os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])
    return None


def load_system(cfg: ExperimentConfig, checkpoint_path: str | Path, device: str | torch.device = "cpu") -> Any:
    """The system of ``cfg`` with the weights of a checkpoint (for export, viewing and chained stages), on ``device``."""
    system = find(cfg.system_type)(cfg.system)
    checkpoint = load_checkpoint(checkpoint_path)
    system.on_load_checkpoint(checkpoint)
    system.load_state_dict(checkpoint["state_dict"])
    return system.to(device)


def export_device() -> torch.device:
    """Where an export after training runs: the CUDA GPU when there is one (meshing renders every training view, as
    the export at the end of training does on its device), else the CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
