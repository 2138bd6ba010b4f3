"""Trainable drafters, one module per method; importing this package registers them all."""
from . import eagle, eagle3, medusa, mtp  # noqa: F401
