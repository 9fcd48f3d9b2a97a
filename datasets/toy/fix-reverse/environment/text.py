def reverse(s):
    return s


def shout(s):
    return s.upper() + "!"
