"""Tiny checkpoints in HF format, built here so tests and demos load a real ``from_pretrained`` model without a hub."""
