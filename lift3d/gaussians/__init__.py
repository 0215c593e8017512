"""3D Gaussians: parameters and activations, initialization, densification strategies; file codecs in ``formats/``."""

from lift3d.gaussians import mcmc, model, strategy, surfels  # noqa: F401  (register the parts)
