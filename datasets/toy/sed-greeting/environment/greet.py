def greet(name):
    return "Helo, " + name + "!"


def shout(name):
    return name.upper()
