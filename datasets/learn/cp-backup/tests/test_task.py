from pathlib import Path


def test_result():
    assert Path("backup.txt").read_text() == "buy milk\n"


def test_kept():
    assert Path("notes.txt").read_text() == "buy milk\n"
