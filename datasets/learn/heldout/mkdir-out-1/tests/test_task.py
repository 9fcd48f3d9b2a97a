from pathlib import Path


def test_result():
    assert Path('report').is_dir()


def test_kept():
    assert Path('README.md').exists()
