"""What symalg's symmetries are used for: teleportation, flat minima, conservation laws, minima geometry,
nonlinear and data-dependent actions, loss symmetries, conjugated actions, ensembles, initialisation."""
