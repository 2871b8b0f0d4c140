"""Stages: one module per cell kind (traces, eval, dataset, screen, adapter)."""
