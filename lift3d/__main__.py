"""``python -m lift3d`` runs the CLI."""

import sys

from lift3d.cli import main

sys.exit(main())
