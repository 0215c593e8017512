"""The Gaussian splat renderer: projection, SH colour, the torch rasterizer's tiles and compositing, the gsplat backend."""
