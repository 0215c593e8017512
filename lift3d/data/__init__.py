"""Data modules: random views for generation, posed photos for reconstruction."""

from lift3d.data import posed_images, random_views  # noqa: F401  (register the data modules)
