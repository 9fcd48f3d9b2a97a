"""`python -m wharf.collect` is `wharf collect`: see wharf/collect/cli.py."""
import sys

from wharf.core.entry import launch

if __name__ == "__main__":
    sys.exit(launch("wharf.collect.cli", "python -m wharf.collect", sys.argv[1:]))
