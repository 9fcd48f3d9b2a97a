from pathlib import Path


def test_result():
    assert Path('port.txt').read_text().strip() == '5685'


def test_kept():
    assert 'web' in Path('config.json').read_text()
