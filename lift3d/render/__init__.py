"""render."""

from lift3d.render import backgrounds, materials, volume  # noqa: F401  (register the volume renderer, materials, backgrounds)
