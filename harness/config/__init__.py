"""Experiment configs: the strict pydantic schema, its YAML loading, where task files are found, and config hashes."""
