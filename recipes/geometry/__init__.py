"""The geometry recipe (see README.md)."""
