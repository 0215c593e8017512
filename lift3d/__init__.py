"""lift3d: text-to-3D and photo-to-3D by optimizing NeRFs, 3D Gaussians and meshes against 2D priors."""

__version__ = "0.1.0"
