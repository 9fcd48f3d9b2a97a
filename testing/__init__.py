"""Test doubles and drivers shared by tests/ and bench/: the vLLM stub, the proxy load generator,
a generated collect job (synthetic_job) for convert."""
