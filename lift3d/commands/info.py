"""``lift3d info``: versions, devices and which optional backends are usable here, without importing torch (package
versions from their metadata, GPUs from ``nvidia-smi``), so it answers at once."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

from lift3d.commands.tables import export_format_status, export_formats, installed

HELP = "print versions, devices and which optional backends are usable"

PACKAGES = ("torch", "lightning", "omegaconf", "numpy", "diffusers", "transformers", "peft", "safetensors",
            "gsplat", "trimesh", "xatlas", "PyMCubes", "plyfile", "imageio", "imageio-ffmpeg", "gradio", "triton", "xformers")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    pass


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for (``torch.version.cuda``), read from its ``version.py`` without importing
    torch; None for a CPU-only build or where it cannot be read."""
    import ast

    try:
        spec = importlib.util.find_spec("torch")
        origin = Path(spec.origin).parent / "version.py" if spec and spec.origin else None
        tree = ast.parse(origin.read_text(encoding="utf-8")) if origin and origin.is_file() else None
    except (ImportError, ValueError, OSError, SyntaxError):
        return None
    for node in tree.body if tree else []:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
            return str(node.value.value) if node.value.value else None
    return None


def nvidia_gpus(timeout: float = 10.0) -> list[str] | None:
    """One line per NVIDIA GPU this process may use (name, memory, compute capability) from ``nvidia-smi``, so no
    torch import is needed; None where there is no NVIDIA driver. ``CUDA_VISIBLE_DEVICES`` is honored."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=index,uuid,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    rows = [[part.strip() for part in line.split(",")] for line in done.stdout.splitlines() if line.count(",") >= 4]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [item.strip() for item in visible.split(",") if item.strip()]
        rows = [next(r for r in rows if item in (r[0], r[1]) or r[1].startswith(item))
                for item in wanted if any(item in (r[0], r[1]) or r[1].startswith(item) for r in rows)]
    lines = []
    for n, (_, _, name, memory, capability) in enumerate(rows):
        gib = f"{float(memory) / 1024:.1f} GiB" if memory.replace(".", "", 1).isdigit() else memory
        lines.append(f"cuda:{n}           {name}, {gib}, sm_{capability.replace('.', '')}")
    return lines


def backend_report(cuda: bool) -> dict[str, str]:
    """Which optional accelerated paths lift3d can use (``cuda``: a CUDA build of torch and a GPU), and why not
    where it cannot."""
    report = {}
    if not installed("gsplat"):
        report["gsplat rasterizer"] = "unavailable (pip install 'lift3d[gpu]' on a CUDA machine)"
    elif not cuda:
        report["gsplat rasterizer"] = "installed, but no CUDA device: the torch rasterizer is used"
    else:
        report["gsplat rasterizer"] = "usable (builds its CUDA kernels on first use)"
    report["torch rasterizer"] = "usable"
    report["triton kernels"] = "usable" if cuda and installed("triton") else "unavailable (needs CUDA and triton)"
    try:
        import imageio_ffmpeg

        report["video (ffmpeg)"] = f"usable ({imageio_ffmpeg.get_ffmpeg_exe()})"
    except Exception as error:  # the bundled binary can be missing on odd platforms
        report["video (ffmpeg)"] = f"unavailable ({error})"
    return report


def run(args: argparse.Namespace) -> int:
    from lift3d.aftercare import writer_status
    from lift3d.version import __version__

    print(f"lift3d {__version__}  (Python {platform.python_version()}, {platform.system()} {platform.machine()})")
    print("packages:")
    for package in PACKAGES:
        print(f"  {package:16s} {_version(package)}")
    print("devices:")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"  CPU cores        {cores}")
    build, gpus = torch_cuda_build(), nvidia_gpus()
    if build is None:
        print("  CUDA             not available: this torch is a CPU-only build (CPU only)")
    elif not gpus:
        print(f"  CUDA             not available: no NVIDIA GPU {'visible' if gpus == [] else 'driver'} here "
              f"(torch is built for CUDA {build}; CPU only)")
    else:
        print(f"  CUDA             {build}")
        for line in gpus:
            print(f"  {line}")
    print("writers (lift3d export --format ...):")
    table, _ = export_formats()
    for name, status in export_format_status().items():
        print(f"  {name:18s} {status}  ({table[name][1]})" if status == "ok" else f"  {name:18s} {status}")
    print("mesh tools:")
    for name, status in writer_status().items():
        if name in ("textures (UV atlas)", "marching cubes"):  # the parts of mesh exports that are no format of their own
            print(f"  {name:19s} {status}")
    print("backends:")
    for name, status in backend_report(cuda=build is not None and bool(gpus)).items():
        print(f"  {name:18s} {status}")
    return 0
