"""`python -m pipeline.report` is `wharf report`: see pipeline/report/cli.py."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("pipeline.report.cli", "python -m pipeline.report", sys.argv[1:]))
