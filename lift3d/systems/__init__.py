"""Systems: training recipes, each a LightningModule built from config."""

from lift3d.systems import dreamfusion, reconstruct_gaussians, reconstruct_nerf  # noqa: F401  (register the recipes)
from lift3d.systems import mesh_stages  # noqa: F401  (registers mesh-stage: magic3d-refine, prolificdreamer-geometry/-texture, texture-mesh)
