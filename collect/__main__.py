"""`python -m collect` is `wharf collect`: see collect/cli.py."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("collect.cli", "python -m collect", sys.argv[1:]))
