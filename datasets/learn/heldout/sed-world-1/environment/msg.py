def msg():
    return "Hello, Eatrh!"


def size():
    return 3
