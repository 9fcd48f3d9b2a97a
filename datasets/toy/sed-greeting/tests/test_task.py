from greet import greet, shout

def test_greet():
    assert greet("Ann") == "Hello, Ann!"

def test_shout():
    assert shout("ann") == "ANN"
