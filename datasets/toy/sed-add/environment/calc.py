def add(a, b):
    return a - b


def neg(a):
    return -a
