"""Presentation: the viewer, exports and experiment tracking."""
