"""Files between the host and a sandbox as tar streams: a host dir packed for upload, a tar the
sandbox made unpacked safely, and the files a filtered download keeps."""
from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from harbor.environments.base import transfer_tar_filter
from harbor.utils.path_filter import filter_paths_by_patterns


def tar_of(source: Path) -> bytes:
    """`source`'s entries (not the dir itself), in name order, as an uncompressed tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for child in sorted(source.iterdir()):
            tf.add(child, arcname=child.name)
    return buf.getvalue()


def extract_safely(data: bytes, target: Path, logger, source: str) -> None:
    """Extract a tar the sandbox made; links or paths leaving the dir are skipped, not followed."""
    target.mkdir(parents=True, exist_ok=True)
    skipped: list[str] = []

    def safe(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        try:
            return transfer_tar_filter(member, dest)
        except tarfile.FilterError:
            skipped.append(member.name)
            return None

    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
        tf.extractall(path=target, filter=safe)
    if skipped:
        logger.warning(f"download {source}: skipped links/paths leaving the dir: {skipped[:10]}")


def copy_selected(source: Path, target: Path, include=None, exclude=None, keep_always=()) -> None:
    """Copy the files under `source` that harbor's include/exclude patterns select, and those of
    `keep_always` (relative paths) that exist, to the same relative paths under `target`."""
    paths = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    keep = set(filter_paths_by_patterns(paths, include=include, exclude=exclude))
    keep |= set(paths) & set(keep_always)
    for rel in sorted(keep):
        dst = target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / rel, dst)
