"""`python -m wharf.train` is `wharf train` (wharf/pipeline/train.py: it passes convert in when a round's
micro-batches are missing; under `accelerate launch -m wharf.train` every process comes here)."""
import sys

from wharf.core.entry import launch

if __name__ == "__main__":
    sys.exit(launch("wharf.pipeline.train", "python -m wharf.train", sys.argv[1:]))
