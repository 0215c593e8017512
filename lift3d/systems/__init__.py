"""Systems: training recipes, each a LightningModule built from config."""

from lift3d.systems import dreamfusion, reconstruct_nerf  # noqa: F401  (register the recipes)
