"""Systems: training recipes, each a LightningModule built from config."""

from lift3d.systems import (  # noqa: F401  (register the recipes)
    dreamfusion,
    edit,
    gaussian_sds,
    generated,
    image_to_3d,
    mesh_stages,
    reconstruct_gaussians,
    reconstruct_nerf,
    reconstruct_surfels,
)
