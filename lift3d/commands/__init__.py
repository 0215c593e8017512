"""CLI sub-commands; modules stay light at import so ``lift3d --help`` is fast."""
