"""A training run: its folder, its Lightning trainer, what stops it (Ctrl-C, SIGTERM) and what it keeps."""
