"""Numerics: random parameters and data, the executable view of a feed-forward network and its forward pass,
certified orbit ranks."""
