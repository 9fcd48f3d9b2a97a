from pathlib import Path


def test_result():
    assert Path("final.txt").read_text() == "the report\n" and not Path("draft.txt").exists()


def test_kept():
    assert Path("README.md").exists()
