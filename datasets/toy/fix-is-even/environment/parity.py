def is_even(n):
    return n % 2 == 1


def double(n):
    return 2 * n
