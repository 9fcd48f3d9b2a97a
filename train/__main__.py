"""`python -m train` is `wharf train` (pipeline/train.py: it passes convert in when a round's
micro-batches are missing; under `accelerate launch -m train` every process comes here)."""
import sys

from wharf.entry import launch

if __name__ == "__main__":
    sys.exit(launch("pipeline.train", "python -m train", sys.argv[1:]))
