from pathlib import Path


def test_result():
    assert Path('count.txt').read_text().strip() == '8'


def test_kept():
    assert 'thistle' in Path('names.txt').read_text()
