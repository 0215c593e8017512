"""The 2D Gaussian surfel renderer (2DGS): each surfel is a flat elliptic disk whose kernel is evaluated where a pixel's
ray meets its plane. ``project`` (ray transforms, bounding boxes, normals), ``composite`` (the pure-PyTorch tiles),
``gsplat_backend`` (gsplat's ``rasterization_2dgs`` on CUDA) and ``renderer`` (the front end and the part)."""
