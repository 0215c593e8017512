"""Data modules: random views for generation, posed photos for reconstruction, one photo for image-to-3D."""

from lift3d.data import posed_images, random_views, single_image  # noqa: F401  (register the data modules)
