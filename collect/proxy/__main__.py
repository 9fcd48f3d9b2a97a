"""`python -m collect.proxy` is `wharf proxy`: see collect/proxy/cli.py."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("collect.proxy.cli", "python -m collect.proxy", sys.argv[1:]))
