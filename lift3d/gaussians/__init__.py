"""3D Gaussians: parameters and activations, SH, initialisation, densification, PLY I/O."""

from lift3d.gaussians import mcmc, model, strategy  # noqa: F401  (register the parts)
