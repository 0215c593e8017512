"""Every Gaussian file codec: 3DGS .ply, .splat, SPZ, SOG (and its levels of detail), .ksplat, glTF splats."""
