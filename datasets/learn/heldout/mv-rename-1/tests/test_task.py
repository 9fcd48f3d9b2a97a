from pathlib import Path


def test_result():
    assert Path('old.txt').read_text() == 'the report\n' and not Path('final.txt').exists()


def test_kept():
    assert Path('README.md').exists()
