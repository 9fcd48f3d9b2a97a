"""Test doubles and drivers shared by tests/ and bench/: the vLLM stub, the proxy load generator."""
