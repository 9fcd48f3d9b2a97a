"""`python -m wharf.pipeline.report` is `wharf report`: see wharf/pipeline/report/cli.py."""
import sys

from wharf.core.entry import launch

if __name__ == "__main__":
    sys.exit(launch("wharf.pipeline.report.cli", "python -m wharf.pipeline.report", sys.argv[1:]))
