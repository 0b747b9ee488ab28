"""The group codes of inference's notes (``"EF, GL, O removed"``) and what they stand for; no heavy imports, so the
command's help can list them.

>>> KIND_NAMES["PS"]
'positive diagonal scaling'
"""

__all__ = ["KIND_NAMES"]

KIND_NAMES = {
    "GL": "general linear GL(h)",
    "O": "orthogonal O(h)",
    "O1": "orthogonal maps fixing the ones vector",
    "C": "complex scaling of planes (rotary embeddings)",
    "PS": "positive diagonal scaling",
    "SF": "sign flips",
    "EF": "sign flips of an even activation's input",
    "S": "permutations",
    "T": "translations of a bias (and shears)",
    "T1": "translation along the ones vector (logits under cross-entropy)",
}
"""What the group codes of the ``blocked:`` and ``restricted:`` notes stand for (the site kinds of
:mod:`symalg.symbolic.inference`)."""
