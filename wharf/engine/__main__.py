"""`python -m wharf.engine` is `wharf serve`: see wharf/engine/cli.py."""
import sys

from wharf.core.entry import launch

if __name__ == "__main__":
    sys.exit(launch("wharf.engine.cli", "python -m wharf.engine", sys.argv[1:]))
