from mathutil import sum_to, mean

def test_sum_to():
    assert sum_to(3) == 6
    assert sum_to(1) == 1

def test_mean():
    assert mean([1, 2, 3]) == 2
