"""A finished (or stopped) run as a Python object: its folder, config, checkpoint, scores and files, its trained model,
and exports of it — what ``lift3d.reconstruct``, ``lift3d.generate`` and ``lift3d.load`` hand back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Run:
    """One run folder (``outputs/<name>/<tag>@<time>/``: ``configs/parsed.yaml``, ``ckpts/``, ``save/``).

    ``stages`` holds the earlier runs of a method with several stages (the Gaussians before the mesh stage), oldest
    first; this run is the last stage. ``allow_imports`` lets the run's config import the plugin code it lists (off:
    a run folder may come from someone else)."""

    path: Path  # the run folder
    stages: list[Run] = field(default_factory=list)  # earlier stages of the same method, oldest first
    allow_imports: bool = False  # let the run's config import the plugins it lists ('imports:')
    _system: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    @property
    def config_path(self) -> Path:
        return self.path / "configs" / "parsed.yaml"

    @property
    def config(self) -> Any:
        """The run's experiment config (``configs/parsed.yaml``), validated."""
        from lift3d.config import load_config

        return load_config(self.config_path, allow_imports=True if self.allow_imports else None)

    @property
    def checkpoint(self) -> Path | None:
        """``ckpts/last.ckpt`` (None when the run wrote no checkpoint)."""
        last = self.path / "ckpts" / "last.ckpt"
        return last if last.is_file() else None

    @property
    def metrics(self) -> dict[str, Any]:
        """``save/metrics.json``: the held-out scores (``{"val": {"psnr": ..., "ssim": ..., "views": ..., "step": ...}}``),
        empty when the run has none."""
        path = self.path / "save" / "metrics.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    @property
    def psnr(self) -> float | None:
        """The held-out PSNR in dB, if the run scored any views."""
        val = self.metrics.get("val") or {}
        return val.get("psnr")

    @property
    def files(self) -> list[Path]:
        """What the run wrote under ``save/`` (exports, videos, grids), sorted."""
        save = self.path / "save"
        return sorted(p for p in save.rglob("*") if p.is_file()) if save.is_dir() else []

    def system(self, device: str = "cpu") -> Any:
        """The trained model (the run's system with its last checkpoint), in eval mode on ``device``."""
        if self._system is None:
            from lift3d.runs.run_dirs import load_system

            if self.checkpoint is None:
                from lift3d.config import ConfigError

                raise ConfigError(f"{self.path} has no checkpoint (ckpts/last.ckpt): nothing to load")
            cfg = self.config
            self._system = load_system(cfg, self.checkpoint).eval()
            self._system.set_save_dir(self.path / "save")
        return self._system.to(device)

    def export(self, *formats: str, overwrite: bool = False, **settings: Any) -> list[Path]:
        """Write the run's assets in ``formats`` (e.g. ``"spz"``, ``"glb"``, ``"3dgs-ply"``; none: the recipe's own list)
        into ``save/``; ``settings`` are export config overrides (``target_faces=20000``). Returns the files written."""
        from lift3d.api.exporting import export_run

        return export_run(self.path, list(formats) or None, overwrite=overwrite, settings=settings,
                          allow_imports=self.allow_imports)

    def __repr__(self) -> str:
        score = f", val PSNR {self.psnr:.2f} dB" if self.psnr is not None else ""
        return f"Run({str(self.path)!r}{score})"


def run_of(path: str | Path, allow_imports: bool = False) -> Run:
    """The run at ``path``: a run folder, its ``configs/parsed.yaml`` or a checkpoint inside it."""
    from lift3d.config import ConfigError

    path = Path(path).expanduser()
    if path.is_file() and (path.suffix == ".ckpt" or path.name == "parsed.yaml"):
        path = path.parent.parent
    if not (path / "configs" / "parsed.yaml").is_file():
        raise ConfigError(f"{path} is not a run folder (it has no configs/parsed.yaml): give the folder a lift3d run "
                          "wrote, e.g. outputs/<name>/<tag>@<time>")
    return Run(path, allow_imports=allow_imports)
