from pathlib import Path


def test_result():
    from ops import pow
    assert pow(2, 5) == 32


def test_kept():
    from ops import mul
    assert mul(2, 3) == 6
