"""SymPy → torch: the torch printer and the one code generator."""
