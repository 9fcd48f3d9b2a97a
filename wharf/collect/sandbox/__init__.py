"""Sandboxes that harbor trials run in when there is no Docker (bubblewrap)."""
