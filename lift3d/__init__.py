"""lift3d: 3D assets from photos, a text prompt or one image, by optimizing NeRFs, 3D Gaussians and meshes against the
photos or a 2D diffusion prior.

The Python API::

    import lift3d

    run = lift3d.reconstruct()                   # the built-in sample scene; or a folder of photos, a video
    run.export("spz")                            # -> [Path('outputs/.../save/...spz')]
    run = lift3d.generate("a DSLR photo of a hamburger", method="gaussian-sds")
    gaussians = lift3d.load("scene.ply")         # a run folder, a Gaussian file of any tool, or a mesh

Extensions register with ``lift3d.register`` (see ``lift3d.registry``); ``lift3d.methods()`` lists every method
(``lift3d.method_table``).
Names are imported on first use, so ``import lift3d`` stays light (the ``lift3d`` command starts at once).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lift3d.version import __version__

# public name -> the module that defines it (imported on first use)
_PUBLIC = {
    "reconstruct": "lift3d.api",
    "generate": "lift3d.api",
    "train": "lift3d.api",
    "load": "lift3d.api",
    "Run": "lift3d.api",
    "GaussianFile": "lift3d.api",
    "Method": "lift3d.method_table",
    "methods": "lift3d.method_table",
    "find_method": "lift3d.method_table",
    "register": "lift3d.registry",
    "find": "lift3d.registry",
    "load_config": "lift3d.config",
}
__all__ = ["GaussianFile", "Method", "Run", "__version__", "find", "find_method", "generate", "load", "load_config", "methods",
           "reconstruct", "register", "train"]

if TYPE_CHECKING:
    from lift3d.api import GaussianFile, Run, generate, load, reconstruct, train
    from lift3d.config import load_config
    from lift3d.method_table import Method, find_method, methods
    from lift3d.registry import find, register


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lift3d' has no attribute '{name}'")


def __dir__() -> list[str]:
    return sorted(__all__)
