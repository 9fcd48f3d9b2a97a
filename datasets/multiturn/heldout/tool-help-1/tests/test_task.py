from pathlib import Path


def test_result():
    assert Path('version.txt').read_text().strip() == '2.9.5'


def test_kept():
    assert 'usage' in Path('tool.py').read_text()
