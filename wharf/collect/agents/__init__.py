"""Agents of our own for harbor trials (loaded by import path)."""
