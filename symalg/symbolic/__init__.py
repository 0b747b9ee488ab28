"""The symbolic stage: inference of sites and groups, derivation, conserved quantities, symbolic checks
and orbit-dimension formulas."""
