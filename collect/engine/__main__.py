"""`python -m collect.engine` is `wharf serve`: see collect/engine/cli.py."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("collect.engine.cli", "python -m collect.engine", sys.argv[1:]))
