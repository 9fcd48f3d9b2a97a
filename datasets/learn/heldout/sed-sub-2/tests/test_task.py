from pathlib import Path


def test_result():
    from ops import add
    assert add(5, 3) == 8


def test_kept():
    from ops import mul
    assert mul(2, 3) == 6
