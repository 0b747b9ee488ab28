"""What symalg knows: activation entries (:mod:`.activations`), the groups that act on sites
(:mod:`.groups`), how a group moves tensor regions (:mod:`.bindings`), and the op rules (:mod:`.rules`)
with their example models (:mod:`.rule_examples`)."""
