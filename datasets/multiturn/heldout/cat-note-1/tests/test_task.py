from pathlib import Path


def test_result():
    assert Path('answer.txt').read_text().strip() == 'marble'


def test_kept():
    assert 'finish' in Path('note.txt').read_text()
