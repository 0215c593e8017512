"""3D Gaussians: parameters and activations, initialization, densification strategies (``strategies/``) and their
parameter surgery (``ops``); file codecs in ``formats/``."""

from lift3d.gaussians import model, strategies, surfels  # noqa: F401  (register the parts)
