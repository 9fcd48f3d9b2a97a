"""`python -m engine` is `wharf serve`: see engine/cli.py."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("engine.cli", "python -m engine", sys.argv[1:]))
