from pathlib import Path


def test_result():
    assert Path('count.txt').read_text().strip() == '43'


def test_kept():
    assert 'week' in Path('notes.txt').read_text()
