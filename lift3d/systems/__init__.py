"""Systems: training recipes, each a LightningModule built from config."""

from lift3d.systems import reconstruct_gaussians  # noqa: F401  (register the recipes)
