def msg():
    return "Hello, Wrold!"


def size():
    return 3
