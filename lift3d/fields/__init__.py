"""fields."""

from lift3d.fields import triplane, volume  # noqa: F401  (register the implicit volume and triplane fields)
