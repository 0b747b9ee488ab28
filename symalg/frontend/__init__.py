"""Front ends: spec strings and the ``Spec`` builder (:mod:`.spec`), torch models (:mod:`.tracing`), the
activation spellings built from the catalogue (:mod:`.canonical`), and the graph passes they run
(:mod:`.attention_folding`)."""
