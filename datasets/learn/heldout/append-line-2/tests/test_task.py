from pathlib import Path


def test_result():
    import config
    assert config.y == 10


def test_kept():
    import config
    assert config.name == "app"
