from pathlib import Path


def test_result():
    assert Path('notes.txt').read_text() == 'pay rent\n'


def test_kept():
    assert Path('copy.txt').read_text() == 'pay rent\n'
