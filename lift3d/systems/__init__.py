"""Systems: training recipes, each a LightningModule built from config."""
