"""`python -m convert` is `wharf convert`: see convert/cli.py."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("convert.cli", "python -m convert", sys.argv[1:]))
