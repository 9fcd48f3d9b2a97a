"""`python -m wharf.convert` is `wharf convert`: see wharf/convert/cli.py."""
import sys

from wharf.core.entry import launch

if __name__ == "__main__":
    sys.exit(launch("wharf.convert.cli", "python -m wharf.convert", sys.argv[1:]))
