def msg():
    return "Hello, Tehre!"


def size():
    return 3
