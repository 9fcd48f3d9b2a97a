def mul(a, b):
    return a + b


def square(a):
    return a ** 2
