"""Which plots a run gets and their PNGs: curves over rounds from the second round on; a run with
one round gets what that round holds (oneround.py). A plot with no data is not drawn."""
from __future__ import annotations

from pathlib import Path

from wharf.core import atomic

from .data import RoundData
from .oneround import ONE_ROUND
from .plots import PLOTS, plt


def plot_set(rounds: list[RoundData]) -> dict:
    """name -> (title, plot, size) for this run: one round, or several."""
    return ONE_ROUND if len(rounds) == 1 else PLOTS


def draw_all(rounds: list[RoundData], out_dir: Path) -> dict[str, tuple[str, Path]]:
    """Write every plot of the run's set that has data; returns name -> (title, PNG path), in order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, (title, fn, size) in plot_set(rounds).items():
        fig = plt.figure(figsize=size, layout="constrained")
        try:
            if fn(rounds, fig):
                path = atomic.write_with(out_dir / f"{name}.png", lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
                written[name] = (title, path)
        finally:
            plt.close(fig)
    return written
