from pathlib import Path


def test_result():
    assert Path('n.txt').read_text().strip() == '151'


def test_kept():
    assert 'want' in Path('check.py').read_text()
