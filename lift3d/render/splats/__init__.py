"""The Gaussian splat renderer: projection, SH color, the torch rasterizer's tiles and compositing, the gsplat backend."""
