from pathlib import Path


def test_result():
    assert Path('answer.txt').read_text().strip() == '627'


def test_kept():
    assert 'print' in Path('hint.py').read_text()
