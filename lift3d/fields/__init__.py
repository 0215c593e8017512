"""fields."""

from lift3d.fields import volume  # noqa: F401  (register the implicit volume field)
