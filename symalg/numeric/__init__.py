"""Numerics: random parameters and data, the network function, certified orbit ranks."""
