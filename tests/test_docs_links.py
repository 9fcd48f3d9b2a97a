"""Every relative link in README.md and docs/**/*.md resolves: the file exists, and a `#anchor` names
a heading (GitHub's slug) or an `<a id>` of the page it points into."""
from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def pages(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    seen: dict[str, int] = {}
    out = set(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """`page: target (why)` for every relative link of `page` that does not resolve."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    # a page below docs/ (docs/experiments/x.md) is named with its folder: x.md may be in docs/ too
    name = page.name if page.name == "README.md" or page.parent.name == "docs" else f"{page.parent.name}/{page.name}"
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{name}: {target} (no heading or anchor '{anchor}' in {dest.name})")
    return bad


def test_every_relative_link_in_the_readme_and_docs_resolves():
    found = pages(REPO)
    assert len(found) > 5, "docs/*.md went missing"
    assert [b for p in found for b in broken_links(p)] == []


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## The `x` key, and more\n\ntext\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md) [ok](docs/a.md#the-x-key-and-more) [web](https://example.org/x)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#nope) [self](#a-readme)\n"
        "```\n[in a fence](nowhere.md)\n```\n# A README\n")
    assert broken_links(tmp_path / "README.md") == [
        "README.md: docs/b.md (no such file)",
        "README.md: docs/a.md#nope (no heading or anchor 'nope' in a.md)",
    ]
    assert broken_links(tmp_path / "docs" / "a.md") == []
    (tmp_path / "docs" / "experiments").mkdir()
    (tmp_path / "docs" / "experiments" / "a.md").write_text("[up](../a.md#a-page) [here](a.md#a-page) [no](../b.md)\n")
    assert broken_links(tmp_path / "docs" / "experiments" / "a.md") == [  # a link resolves from its page's folder
        "experiments/a.md: a.md#a-page (no heading or anchor 'a-page' in a.md)",
        "experiments/a.md: ../b.md (no such file)",
    ]
