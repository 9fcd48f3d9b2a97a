from pathlib import Path


def test_result():
    assert Path('done.txt').read_text().strip() == 'harbor'


def test_kept():
    assert 'todo' in Path('TODO').read_text()
