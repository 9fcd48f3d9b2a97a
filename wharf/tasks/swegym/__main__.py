"""`python -m wharf.tasks.swegym ROWS_FILE OUT_DIR [...]` (see the package docstring)."""
import sys

from .cli import main

sys.exit(main())
