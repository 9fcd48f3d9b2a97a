from pathlib import Path


def test_result():
    assert Path('count.txt').read_text().strip() == '6'


def test_kept():
    assert 'meadow' in Path('names.txt').read_text()
