"""Models of this capability (see memory/models/__init__.py)."""
