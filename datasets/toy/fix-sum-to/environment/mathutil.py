def sum_to(n):
    total = 0
    for i in range(1, n):
        total += i
    return total


def mean(xs):
    return sum(xs) / len(xs)
