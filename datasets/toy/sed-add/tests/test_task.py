from calc import add, neg

def test_add():
    assert add(2, 3) == 5

def test_neg():
    assert neg(4) == -4
