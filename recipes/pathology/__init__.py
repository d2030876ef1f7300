"""The pathology recipe (see README.md)."""
