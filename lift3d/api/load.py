"""``lift3d.load(path)``: a run folder or checkpoint, a Gaussian file from any tool, or a mesh file, as a Python object."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lift3d.api.run import Run, run_of

MESH_SUFFIXES = (".obj", ".gltf", ".stl", ".off")  # always meshes; .glb and .ply may hold Gaussians or a mesh


@dataclass
class GaussianFile:
    """The Gaussians of a file (3DGS .ply, .splat, .spz, .sog, .ksplat, KHR_gaussian_splatting .glb ...) in a
    reconstruct-gaussians system: ``model`` holds them (``model.means``, ``model.scales``, ``model.opacities``, ...),
    ``parameters`` the pre-activation tensors as read."""

    path: Path
    system: Any = field(repr=False)  # a reconstruct-gaussians system holding the Gaussians (renders and exports them)
    parameters: dict[str, Any] = field(repr=False)  # means, log_scales, quats, opacity_logits, sh0, shN

    @property
    def model(self) -> Any:
        """The ``GaussianModel`` (activated ``scales``, ``opacities``, ``sh`` beside the stored parameters)."""
        return self.system.gaussians

    def __len__(self) -> int:
        return len(self.parameters["means"])

    def export(self, *formats: str, overwrite: bool = False, **settings: Any) -> list[Path]:
        """Convert the file into ``formats`` (e.g. ``"spz"``, ``"glb"``, ``"splat"``), written beside it and named after it
        and the format; ``settings`` are export config overrides by key; ``overwrite`` replaces files lift3d did not
        write. Returns the files written."""
        from lift3d.api.exporting import export_gaussian_file
        from lift3d.api.overrides import as_overrides

        overrides = as_overrides({f"system.export.{key}": value for key, value in settings.items()})
        return export_gaussian_file(self.path, list(formats) or ["glb", "splat"], overrides, overwrite=overwrite)


def load(path: str | Path, allow_imports: bool = False) -> Run | GaussianFile | Any:
    """What ``path`` holds: a ``Run`` for a run folder (or its config or a checkpoint in it), a ``GaussianFile`` for a
    Gaussian file of any supported format, a ``Mesh`` for a mesh file (.obj, .glb, .gltf, .ply with faces ...).
    ``allow_imports`` lets a run's config import the plugin code it lists."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"nothing at {path}: give a run folder, a Gaussian file or a mesh file")
    if path.is_dir() or path.suffix in (".ckpt", ".yaml"):
        return run_of(path, allow_imports=allow_imports)
    if path.suffix.lower() not in MESH_SUFFIXES and holds_gaussians(path):
        from lift3d.systems.gaussian_files import gaussian_file_system

        system, params = gaussian_file_system(path)
        return GaussianFile(path, system, params)
    from lift3d.meshes.io import load_mesh

    return load_mesh(path)


def holds_gaussians(path: Path) -> bool:
    """Whether a file is a Gaussian file: a suffix only Gaussians use, or a .ply / .glb whose header says Gaussians."""
    suffix = path.suffix.lower()
    if suffix in (".splat", ".spz", ".sog", ".ksplat") or path.name.endswith("lod-meta.json"):
        return True
    head = path.read_bytes()[:65536] if suffix in (".ply", ".glb") else b""
    if suffix == ".ply":
        return b"f_dc_0" in head or b"opacity" in head
    return b"KHR_gaussian_splatting" in head
