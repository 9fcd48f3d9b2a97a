"""`python -m wharf.collect.proxy` is `wharf proxy`: see wharf/collect/proxy/cli.py."""
import sys

from wharf.core.entry import launch

if __name__ == "__main__":
    sys.exit(launch("wharf.collect.proxy.cli", "python -m wharf.collect.proxy", sys.argv[1:]))
