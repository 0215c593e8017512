"""Feed-forward generators: one image -> a 3D representation in one forward pass (``lift3d.generators.base``).

Importing the package registers ``triposr``.
"""

from lift3d.generators import triposr  # noqa: F401  (register the generators)
