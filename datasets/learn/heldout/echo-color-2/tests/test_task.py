from pathlib import Path


def test_result():
    assert Path('color.txt').read_text().strip() == 'yellow'


def test_kept():
    assert 'colors' in Path('notes.txt').read_text()
