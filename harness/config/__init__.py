"""Experiment configs: the strict pydantic schema and its YAML loading."""
