from pathlib import Path


def test_result():
    assert Path('name.txt').read_text().strip() == 'saffron'


def test_kept():
    assert 'inside' in Path('box/saffron.txt').read_text()
