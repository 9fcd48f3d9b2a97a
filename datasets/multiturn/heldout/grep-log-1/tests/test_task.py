from pathlib import Path


def test_result():
    assert Path('code.txt').read_text().strip() == '528'


def test_kept():
    assert 'INFO' in Path('app.log').read_text()
