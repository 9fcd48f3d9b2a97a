from pathlib import Path


def test_result():
    assert Path('answer.txt').read_text().strip() == 'pebble'


def test_kept():
    assert 'secret word' in Path('word.txt').read_text()
