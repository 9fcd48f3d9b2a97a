from pathlib import Path


def test_result():
    from msg import msg
    assert msg() == 'Hello, Earth!'


def test_kept():
    from msg import size
    assert size() == 3
