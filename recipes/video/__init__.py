"""The video recipe (see README.md)."""
