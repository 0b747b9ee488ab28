"""``|z|`` in the catalogue: positive scaling (continuous, conserved ``‖w_i‖² + b_i² − ‖v_i‖²``) and the sign flips of
the input alone (:class:`~symalg.catalogue.groups.EvenFlips`: the readers of ``|z|`` stay), from spec strings and from
traced torch (``torch.abs``, ``x.abs()``, ``torch.absolute``, ``abs_``); the near misses where the flips must go."""
import pytest
import torch

import symalg
from symalg.catalogue.groups import EvenFlips

torch_f64 = torch.float64


def _labels(analysis):
    return sorted(s.group.name for s in analysis.symmetries)


def _by_kind(analysis, kind):
    return [s for s in analysis.symmetries if s.group.kind == kind]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


class _Abs(torch.nn.Module):
    def __init__(self, spelling: str, n: int = 3, h: int = 4, m: int = 2):
        super().__init__()
        self.spelling, self.a, self.b = spelling, torch.nn.Linear(n, h), torch.nn.Linear(h, m)

    def forward(self, x):
        z = self.a(x)
        if self.spelling == "torch.abs":
            y = torch.abs(z)
        elif self.spelling == "method":
            y = z.abs()
        elif self.spelling == "absolute":
            y = torch.absolute(z)
        else:
            y = z.clone().abs_()
        return self.b(y)


def _traced(module: torch.nn.Module, n: int = 3):
    torch.manual_seed(0)
    module = module.double()
    x = torch.randn(16, n, dtype=torch_f64)
    return module, x, symalg.derive(symalg.trace(module, (x,)))


def test_spec_string_claims_scaling_input_flips_and_permutations():
    analysis = symalg.derive("linear(2, 3) -> abs -> linear(3, 1)")
    assert _labels(analysis) == ["EvenFlips(3)", "PositiveScaling(3, alpha=1)", "S(3)"]
    flips, = _by_kind(analysis, "EF")
    scaling, = _by_kind(analysis, "PS")
    assert set(flips.tensors) == {"0.weight", "0.bias"}           # the reader 2.weight stays
    assert set(scaling.tensors) == {"0.weight", "0.bias", "2.weight"}
    assert flips.group.dim == 0 and flips.conserved is None       # discrete: no conserved quantity
    assert scaling.group.dim == 3 and scaling.conserved is not None


@pytest.mark.parametrize("spelling", ["torch.abs", "method", "absolute", "inplace"])
def test_traced_spellings_are_the_catalogue_entry_and_hold_numerically(spelling):
    module, x, analysis = _traced(_Abs(spelling))
    assert _labels(analysis) == ["EvenFlips(4)", "PositiveScaling(4, alpha=1)", "S(4)"]
    params = dict(module.named_parameters())
    y = torch.func.functional_call(module, params, (x,))
    flips, = _by_kind(analysis, "EF")
    scaling, = _by_kind(analysis, "PS")
    signs = torch.diag(torch.tensor([-1.0, 1.0, -1.0, -1.0], dtype=torch_f64))
    flipped = flips.apply(params, signs)
    assert torch.equal(flipped["b.weight"], params["b.weight"])
    assert torch.equal(flipped["a.weight"], signs @ params["a.weight"])
    assert _relative(torch.func.functional_call(module, flipped, (x,)), y) < 1e-14
    d = torch.tensor([0.1, 3.0, 0.5, 7.0], dtype=torch_f64)
    scaled = scaling.apply(params, d)
    assert torch.allclose(scaled["b.weight"], params["b.weight"] / d)
    assert _relative(torch.func.functional_call(module, scaled, (x,)), y) < 1e-13
    # the flips of a reader would not be a symmetry: flipping 2.weight's columns too changes the output
    wrong = dict(flipped, **{"b.weight": params["b.weight"] @ signs})
    assert _relative(torch.func.functional_call(module, wrong, (x,)), y) > 1e-2


def test_verify_passes_and_the_scaling_quantity_is_conserved_while_the_flips_give_none():
    module, x, analysis = _traced(_Abs("torch.abs"))
    report = symalg.verify(analysis)
    assert report.passed, report.summary()
    # gradient descent with a small step: q_i = ‖a.weight_i‖² + a.bias_i² − ‖b.weight[:, i]‖² drifts by O(η²) per step
    params = {k: v.detach().clone().requires_grad_(True) for k, v in module.named_parameters()}
    target = torch.randn(16, 2, dtype=torch_f64, generator=torch.Generator().manual_seed(1))

    def q(p):
        return p["a.weight"].pow(2).sum(1) + p["a.bias"].pow(2) - p["b.weight"].pow(2).sum(0)

    def energy(p):   # the sum of squares, which is no conserved quantity
        return sum(p[k].pow(2).sum() for k in ("a.weight", "a.bias", "b.weight"))

    start, start_energy = q(params).detach(), energy(params).detach()
    for _ in range(200):
        loss = (torch.func.functional_call(module, params, (x,)) - target).pow(2).mean()
        grads = torch.autograd.grad(loss, list(params.values()))
        with torch.no_grad():
            for p, g in zip(params.values(), grads):
                p -= 1e-4 * g
    drift = float((q(params).detach() - start).abs().max())
    moved = float((energy(params).detach() - start_energy).abs())
    assert drift < 1e-5 and moved > 1e3 * drift, (drift, moved)


def test_even_flips_act_on_the_input_side_only():
    group = EvenFlips(3)
    g = group.discrete_generators()[1]
    assert torch.equal(group.rep(g), torch.eye(3, dtype=torch_f64))          # π(g) = I on |z|
    assert torch.equal(group.operator(g, "out"), torch.tensor([1.0, -1.0, 1.0], dtype=torch_f64))
    with pytest.raises(ValueError, match="no center"):
        EvenFlips(3, center=1)


class _NearMiss(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind, self.a, self.b, self.c = kind, torch.nn.Linear(3, 4), torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)

    def forward(self, x):
        z = self.a(x)
        if self.kind == "plus":        # |z| + z = 2 relu(z): the input is read again
            return self.b(z.abs() + z)
        if self.kind == "odd":         # z |z| is odd: no flips
            return self.b(z * z.abs())
        if self.kind == "skip":        # a second reader of z: it moves with the flips (sound), b stays
            return self.b(z.abs()) + self.c(z)
        if self.kind == "sigmoid":     # σ(|z|): the flips hold, the scaling does not
            return self.b(torch.sigmoid(z.abs()))
        return self.b((z - 0.5).abs())   # shifted: |z − ½| is not even in z


@pytest.mark.parametrize("kind, expected", [
    ("plus", ["PositiveScaling(4, alpha=1)", "S(4)"]),
    ("odd", ["PositiveScaling(4, alpha=1)", "S(4)"]),   # z |z| is homogeneous (degree 2): each factor reader moves
    ("skip", ["EvenFlips(4)", "PositiveScaling(4, alpha=1)", "S(4)"]),
    ("sigmoid", ["EvenFlips(4)", "S(4)"]),
    ("shifted", ["S(4)"]),
])
def test_near_misses(kind, expected):
    torch.manual_seed(0)
    module = _NearMiss(kind).double()
    x = torch.randn(16, 3, dtype=torch_f64)
    analysis = symalg.derive(symalg.trace(module, (x,)), certify=False)   # the rules alone
    assert _labels(analysis) == expected
    params = dict(module.named_parameters())
    y = module(x)
    for symmetry in analysis.symmetries:
        for _, g in symmetry.group.sample(torch.Generator().manual_seed(3)):
            moved = symmetry.apply(params, g)
            assert _relative(torch.func.functional_call(module, moved, (x,)), y) < 1e-12, symmetry.label
    if kind == "skip":
        flips, = _by_kind(analysis, "EF")
        assert set(flips.tensors) == {"a.weight", "a.bias", "c.weight"}


def test_abs_after_relu_and_before_tanh():
    """``relu`` then ``|·|``: only relu's scaling (its output is nonnegative, but the rules do not use that); ``|·|``
    then ``tanh``: the flips survive tanh (its input does not move), the scaling does not."""
    x = torch.randn(8, 2, dtype=torch_f64)
    first = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)).double()
    relu_abs = symalg.trace(_Lambda(lambda m, v: m[2](torch.relu(m[0](v)).abs()), first), (x,))
    assert _labels(symalg.derive(relu_abs)) == ["PositiveScaling(3, alpha=1)", "S(3)"]
    abs_tanh = symalg.trace(_Lambda(lambda m, v: m[2](torch.tanh(m[0](v).abs())), first), (x,))
    assert _labels(symalg.derive(abs_tanh)) == ["EvenFlips(3)", "S(3)"]


class _Lambda(torch.nn.Module):
    def __init__(self, forward, layers):
        super().__init__()
        self.layers, self.function = layers, forward

    def forward(self, x):
        return self.function(self.layers, x)
