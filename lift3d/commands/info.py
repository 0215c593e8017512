"""``lift3d info``: versions, devices and which optional backends are usable here."""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import platform

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


def backend_report() -> dict[str, str]:
    """Which optional accelerated paths lift3d can use, and why not where it cannot."""
    import torch

    cuda = torch.cuda.is_available()
    report = {}
    if importlib.util.find_spec("gsplat") is None:
        report["gsplat rasterizer"] = "unavailable (pip install 'lift3d[gpu]' on a CUDA machine)"
    elif not cuda:
        report["gsplat rasterizer"] = "installed, but no CUDA device: the torch rasterizer is used"
    else:
        report["gsplat rasterizer"] = "usable (builds its CUDA kernels on first use)"
    report["torch rasterizer"] = "usable"
    report["triton kernels"] = "usable" if cuda and importlib.util.find_spec("triton") else "unavailable (needs CUDA and triton)"
    try:
        import imageio_ffmpeg

        report["video (ffmpeg)"] = f"usable ({imageio_ffmpeg.get_ffmpeg_exe()})"
    except Exception as error:  # the bundled binary can be missing on odd platforms
        report["video (ffmpeg)"] = f"unavailable ({error})"
    return report


def run(args: argparse.Namespace) -> int:
    import torch

    from lift3d.version import __version__

    print(f"lift3d {__version__}  (Python {platform.python_version()}, {platform.system()} {platform.machine()})")
    print("packages:")
    for package in PACKAGES:
        print(f"  {package:16s} {_version(package)}")
    print("devices:")
    print(f"  CPU threads      {torch.get_num_threads()}")
    if torch.cuda.is_available():
        print(f"  CUDA             {torch.version.cuda}")
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            print(f"  cuda:{i}           {props.name}, {props.total_memory / 2**30:.1f} GiB, sm_{props.major}{props.minor}")
    else:
        print("  CUDA             not available (CPU only)")
    print("writers (lift3d export --format ...):")
    from lift3d.aftercare import writer_status
    from lift3d.export.formats import export_table, format_status

    for name, status in format_status().items():
        print(f"  {name:18s} {status}  ({export_table()[name].description})" if status == "ok" else f"  {name:18s} {status}")
    print("mesh tools:")
    for name, status in writer_status().items():
        if name in ("textures (UV atlas)", "marching cubes"):  # the parts of mesh exports that are no format of their own
            print(f"  {name:19s} {status}")
    print("backends:")
    for name, status in backend_report().items():
        print(f"  {name:18s} {status}")
    return 0
