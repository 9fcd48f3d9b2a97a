from app.settings import host, port

def test_port_is_int():
    assert port() == 8080

def test_host():
    assert host() == "127.0.0.1"
