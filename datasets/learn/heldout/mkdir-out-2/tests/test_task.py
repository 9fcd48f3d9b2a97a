from pathlib import Path


def test_result():
    assert Path('todo').is_dir()


def test_kept():
    assert Path('README.md').exists()
