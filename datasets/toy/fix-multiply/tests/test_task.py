from calc import mul, square

def test_mul():
    assert mul(3, 4) == 12

def test_square():
    assert square(3) == 9
