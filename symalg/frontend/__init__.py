"""Front ends: spec strings and the ``Spec`` builder (:mod:`.spec`), torch models (:mod:`.tracing`),
and the graph passes they run (:mod:`.attention_folding`)."""
