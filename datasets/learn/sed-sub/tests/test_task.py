from pathlib import Path


def test_result():
    from ops import sub
    assert sub(5, 3) == 2


def test_kept():
    from ops import mul
    assert mul(2, 3) == 6
