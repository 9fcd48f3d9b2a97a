"""A collect round whose rows have no manifest: refused by convert and by a resume.

Its manifest names the round's job id, and every rollout's GRPO group carries that id; a resume
that drew a new one would put old and new attempts of a task in different groups, and a convert
would take rows no manifest vouches for. Such a round only comes from a push cut short by older
code (or a deleted file): collect keeps a manifest in the bucket through every push."""
from __future__ import annotations

from wharf.core.errors import WharfError
from wharf.core.layout import CollectPaths


class ManifestMissing(WharfError):
    """Rows with no manifest: the user decides what the round is (exit 2, nothing written)."""

    exit_code = 2


def require_manifest(paths: CollectPaths, round_index: int | None, rows_without_manifest: bool | None = None) -> None:
    """Refuse the round when it holds finished rollouts but no manifest.json (by default: the
    files on disk decide; a caller that read both passes what it found)."""
    missing = (paths.rollouts.is_file() and not paths.manifest.is_file()) if rows_without_manifest is None \
        else rows_without_manifest
    if not missing:
        return
    which = f"round {round_index}" if round_index is not None else str(paths.root)
    raise ManifestMissing(
        f"{which}: {paths.rollouts} holds finished rollouts but {paths.manifest.name} is missing, so its job id "
        f"(and its GRPO groups) are unknown: put the round's manifest.json back, or move rollouts.parquet and "
        f"turns/ aside to collect the round again")
