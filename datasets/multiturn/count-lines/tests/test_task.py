from pathlib import Path


def test_result():
    assert Path('count.txt').read_text().strip() == '9'


def test_kept():
    assert 'walnut' in Path('names.txt').read_text()
