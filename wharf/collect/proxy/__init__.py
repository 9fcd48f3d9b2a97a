"""The recording proxy between CLI agents and the endpoint (see server.py)."""
