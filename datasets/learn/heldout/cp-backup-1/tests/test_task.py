from pathlib import Path


def test_result():
    assert Path('draft.txt').read_text() == 'buy bread\n'


def test_kept():
    assert Path('copy.txt').read_text() == 'buy bread\n'
