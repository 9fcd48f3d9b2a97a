"""Reading SWE-Gym / SWE-bench rows files (.jsonl, .json, .parquet) and the parts of a row's diffs."""
from __future__ import annotations

import json
import re
from pathlib import Path

# swebench's NON_TEST_EXTS: files of a test patch that are not test modules.
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


class RowError(ValueError):
    """A row that cannot become a task; the message names file, row, instance and field."""


def read_rows(path: Path) -> list[dict]:
    """Rows of a .jsonl, .json or .parquet file, as dicts (errors name the file and line)."""
    if not path.is_file():
        raise RowError(f"{path}: no such file (give a .jsonl, .json or .parquet of SWE-Gym/SWE-bench rows)")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # pyarrow raises several types for a bad file
            raise RowError(f"{path}: not a readable parquet file ({e})") from e
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise RowError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(rows, list):
            raise RowError(f"{path}: a .json rows file must hold a list of objects")
        return rows
    if suffix != ".jsonl":
        raise RowError(f"{path}: unknown rows format {suffix!r}; use .jsonl, .json or .parquet")
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise RowError(f"{path}: line {n} is not valid JSON ({e})") from e
    return rows


def test_ids(value, field: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # SWE-bench: a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise RowError(f"{where}: field {field!r} is a string but not a JSON list ({e})") from e
    if hasattr(value, "tolist"):  # numpy arrays from parquet readers
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise RowError(f"{where}: field {field!r} must be a list of test ids, got {str(value)[:120]!r}")
    return value


def patch_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (both sides of a rename), in order."""
    files: list[str] = []
    for m in re.finditer(r"^diff --git a/(\S+) b/(\S+)$", patch, re.M):
        for f in m.groups():
            if f not in files:
                files.append(f)
    return files


def added_or_modified_py(patch: str) -> list[str]:
    """Test modules the test patch leaves in the tree (deleted files cannot be run)."""
    out = []
    for block in re.split(r"^(?=diff --git )", patch, flags=re.M):
        m = re.match(r"diff --git a/(\S+) b/(\S+)", block)
        if not m or re.search(r"^deleted file mode", block, re.M):
            continue
        path = m.group(2)
        if path.endswith(".py") and not path.endswith(NON_TEST_EXTS) and path not in out:
            out.append(path)
    return out
