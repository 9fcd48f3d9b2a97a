DEFAULT_PORT = "8080"
DEFAULT_HOST = "127.0.0.1"


def port():
    return DEFAULT_PORT


def host():
    return DEFAULT_HOST
