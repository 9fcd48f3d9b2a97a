from pathlib import Path


def test_result():
    assert Path('answer.txt').read_text().strip() == '480'


def test_kept():
    assert 'print' in Path('code.py').read_text()
