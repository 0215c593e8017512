"""The Python API: the main jobs (``reconstruct``, ``generate``, ``train``), what they return (``Run``), ``load`` for any
run or Gaussian / mesh file, and the method table. The ``lift3d`` command is a thin layer over these functions."""

from lift3d.api.generate import generate
from lift3d.api.load import GaussianFile, load
from lift3d.api.reconstruct import reconstruct
from lift3d.api.run import Run
from lift3d.api.train import train

__all__ = ["GaussianFile", "Run", "generate", "load", "reconstruct", "train"]
