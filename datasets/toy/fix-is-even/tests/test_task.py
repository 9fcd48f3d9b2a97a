from parity import is_even, double

def test_is_even():
    assert is_even(4) and not is_even(7)

def test_double():
    assert double(5) == 10
