from pathlib import Path


def test_result():
    assert Path('version.txt').read_text().strip() == '3.15.2'


def test_kept():
    assert 'usage' in Path('tool.py').read_text()
