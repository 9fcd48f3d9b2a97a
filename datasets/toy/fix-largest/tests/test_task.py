from stats import largest, total

def test_largest():
    assert largest([3, 9, 1]) == 9

def test_total():
    assert total([1, 2, 3]) == 6
