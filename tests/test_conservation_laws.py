"""Conservation laws of gradient flow from the Lie algebra of the gradient fields, against symalg's
symmetry-derived quantities (symalg/applications/conservation_laws.py)."""
import itertools
import random

import pytest
import sympy as sp
import torch
from torch.func import grad, jvp

import symalg
from symalg.catalogue.activations import declare_linear, declare_pointwise
from symalg.applications.conservation_laws import (_Chain, _draw, _evaluate, compare_with_symmetries,
                                                   count_conservation_laws, random_point)
from symalg.errors import SpecError
from symalg.numeric.orbit_rank import action_matrix, independent_conserved_rank

# (widths, activation, bias): depths 2-4, widths 2-9, bottlenecks and wide layers, both activations
GRID = [
    ((3, 4, 2), "linear", False), ((2, 9, 2), "linear", False), ((9, 2, 9), "linear", False),
    ((5, 5, 5), "linear", False), ((4, 5, 3, 2), "linear", False), ((6, 7, 6, 8), "linear", False),
    ((2, 9, 9, 2), "linear", False), ((2, 9, 2, 9, 2), "linear", False), ((3, 8, 2, 7, 4), "linear", False),
    ((3, 4, 2), "linear", True), ((9, 9, 9), "linear", True), ((2, 6, 3), "linear", True),
    ((6, 7, 6, 8), "linear", True), ((2, 5, 7, 3, 4), "linear", True), ((9, 9, 9, 9, 9), "linear", True),
    ((3, 4, 2), "relu", False), ((9, 2, 9), "relu", False), ((4, 5, 3, 2), "relu", False),
    ((2, 9, 9, 2), "relu", False), ((7, 3, 8, 2, 5), "relu", False),
    ((2, 2, 2), "relu", True), ((3, 4, 2), "relu", True), ((8, 3, 6, 2), "relu", True),
    ((2, 9, 2, 9, 2), "relu", True), ((9, 9, 9, 9, 9), "relu", True),
]
MIXED = ["linear(3, 4) -> relu -> linear(4, 5) -> identity -> linear(5, 2)",
         "linear(2, 6, bias=False) -> identity -> linear(6, 3, bias=False) -> leaky_relu -> linear(3, 4, bias=False)"]


def _symmetry_count(laws) -> int:
    """symalg's functionally independent conserved quantities at the point the laws were counted at."""
    return independent_conserved_rank(symalg.derive(laws.architecture), laws.params)


@pytest.mark.parametrize("widths, activation, bias", GRID, ids=lambda x: str(x))
def test_conservation_laws_equal_independent_symmetry_quantities(widths, activation, bias):
    result = compare_with_symmetries(widths, activation, bias)
    assert result.complete, str(result)
    assert result.laws.n_laws == result.symmetry_count == _symmetry_count(result.laws)
    assert result.laws.stopped in ("bound", "full")
    assert result.orthogonality < 1e-6
    assert result.laws.gap > 1e5


@pytest.mark.parametrize("spec", MIXED)
def test_mixed_identity_and_relu_chains_are_complete(spec):
    result = compare_with_symmetries(spec)
    assert result.complete, str(result)
    assert result.laws.n_laws == _symmetry_count(result.laws)


@pytest.mark.parametrize("widths, activation, bias", [GRID[0], GRID[4], GRID[9], GRID[13], GRID[16], GRID[22],
                                                      GRID[6]], ids=lambda x: str(x))
def test_stagnation_alone_finds_the_symmetry_count(widths, activation, bias):
    """Without the symmetry bound the search runs until a level adds nothing, and lands on the same count."""
    laws = count_conservation_laws(widths, activation, bias)
    assert laws.stopped == "stagnated"
    assert laws.ranks[-1] == laws.ranks[-2]
    assert laws.n_laws == _symmetry_count(laws)
    assert laws.gap > 1e5


@pytest.mark.parametrize("n0, h, n2", [(3, 4, 2), (2, 7, 3), (4, 2, 5), (1, 3, 1)])
def test_two_layer_linear_trace_is_the_so_pq_orbit(n0, h, n2):
    """Hand derivation: for θ = (W1, W2), ∇⟨A, W2 W1⟩ moves Z = [W2; W1ᵀ] by [[0, A], [Aᵀ, 0]] Z, and these
    generate so(n2, n0) (antisymmetric diagonal blocks, symmetric off-diagonal block), so the trace is
    {M Z : M ∈ so(n2, n0)}, computed here without brackets."""
    laws = count_conservation_laws([n0, h, n2])
    w1, w2 = laws.params["0.weight"], laws.params["2.weight"]
    z, p = torch.cat([w2, w1.T]), n0 + n2
    tangents = []
    for i, j in itertools.combinations(range(p), 2):
        m = torch.zeros(p, p, dtype=torch.float64)
        m[i, j], m[j, i] = 1.0, (-1.0 if (i < n2) == (j < n2) else 1.0)
        mz = m @ z
        tangents.append(torch.cat([mz[n2:].T.reshape(-1), mz[:n2].reshape(-1)]))
    tangents = torch.stack(tangents)
    assert laws.dim_lie == torch.linalg.matrix_rank(tangents)
    assert (tangents - tangents @ laws.basis.T @ laws.basis).norm() < 1e-10 * tangents.norm()
    assert laws.height == (0 if laws.dim_fields == laws.dim_lie else 1)


def test_two_layer_relu_fields_need_no_bracket():
    """Per hidden neuron the path lifting is the rank-one u_j v_jᵀ, whose differential has rank m + n − 1:
    dim W = D − h already, and the balances ‖v_j‖² − ‖u_j‖² are all the laws."""
    laws = count_conservation_laws([4, 5, 3], activation="relu")
    assert (laws.n_params, laws.dim_fields, laws.dim_lie, laws.height) == (35, 30, 30, 0)


def test_trace_is_the_orthogonal_complement_of_the_symmetry_gradients():
    arch = symalg.parse("linear(4, 5) -> identity -> linear(5, 3) -> identity -> linear(3, 2)")
    laws = count_conservation_laws(arch)
    gradients = action_matrix(symalg.derive(arch), laws.params, symmetric=True)   # rows M·θ = ∇Q_M / 2
    assert (gradients @ laws.basis.T).abs().max() < 1e-10 * gradients.abs().max()
    assert torch.linalg.matrix_rank(gradients) + laws.dim_lie == laws.n_params


def test_truncated_filtration_gives_a_wrong_count():
    """Two-layer linear nets need one bracket: W alone leaves D − dim W = 14 candidate laws, not 10."""
    laws = count_conservation_laws([3, 4, 2], max_level=1)
    assert (laws.n_laws, laws.stopped, laws.stabilised) == (14, "max_level", False)
    assert compare_with_symmetries([3, 4, 2], max_level=1, certify=False).statement.startswith("undetermined")
    deep = compare_with_symmetries([2, 9, 9, 2], max_level=4)   # this bottleneck needs brackets of height 4
    assert not deep.complete and deep.laws.n_laws > deep.symmetry_count


def test_a_low_bound_does_not_hide_laws_and_a_false_symmetry_is_caught():
    assert count_conservation_laws([3, 4, 2], known_laws=5).n_laws == 10
    relu_as_linear = symalg.overlay({"relu": symalg.CatalogueEntry("relu", lambda z: sp.Max(z, 0), declare_linear())})
    arch = symalg.parse("linear(3, 4, bias=False) -> relu -> linear(4, 2, bias=False)", catalogue=relu_as_linear)
    # uncertified, the overlay's GL(4) for ReLU is claimed; the comparison refutes it
    wrong = symalg.derive(arch, catalogue=relu_as_linear, strict=False, certify=False)
    assert [s.group.name for s in wrong.symmetries] == ["GL(4)"]
    result = compare_with_symmetries(wrong)
    assert result.symmetry_count == 10 and result.laws.n_laws == 4
    assert result.statement.startswith("inconsistent"), result.statement
    # certified (the default), the numerical certification already removes the false claim
    certified = symalg.derive(arch, catalogue=relu_as_linear, strict=False)
    assert not certified.symmetries and "failed numerical certification" in str(certified.blocked)
    assert compare_with_symmetries(certified).symmetry_count == 0


def test_leaky_relu_with_slope_one_is_linear_and_complete():
    """leaky_relu(slope=1) is the identity: its gradient fields are those of a linear net (GL(4): 10 laws), and
    the catalogue declares GL(h) at slope 1, so symalg's quantities are complete; slope −1 is |z| (scalings)."""
    result = compare_with_symmetries("linear(3, 4) -> leaky_relu(slope=1) -> linear(4, 2)")
    assert (result.laws.n_laws, result.symmetry_count) == (10, 10) and result.complete, result.statement
    assert compare_with_symmetries("linear(3, 4) -> leaky_relu(slope=-1) -> linear(4, 2)").complete   # |z|


def test_a_symmetry_the_catalogue_does_not_declare_is_reported_incomplete():
    """A catalogue that declares ReLU pointwise only (permutations, no scalings) misses the 4 laws
    ``‖w_in,i‖² − ‖w_out,i‖²``; the comparison says so instead of agreeing."""
    relu_pointwise = symalg.overlay({"relu": symalg.CatalogueEntry("relu", lambda z: sp.Max(z, 0),
                                                                   declare_pointwise())})
    arch = symalg.parse("linear(3, 4) -> relu -> linear(4, 2)", catalogue=relu_pointwise)
    result = compare_with_symmetries(symalg.derive(arch, catalogue=relu_pointwise))
    assert (result.laws.n_laws, result.symmetry_count) == (4, 0)
    assert result.statement == "incomplete: 4 extra laws beyond symalg's quantities"


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")   # raised inside torch.func
def test_brackets_match_nested_autodiff():
    """Hyper-dual brackets against torch.func: ∇Φ_c by reverse mode, brackets by nested jvp, on a ReLU chain
    with biases, for the level-3 samples [a R1 + [R1, R2], a' R1' + [R1', R2']] (every field scaled to unit
    norm at θ, as the module does when brackets do not cancel)."""
    arch = symalg.parse("linear(2, 3) -> relu -> linear(3, 2) -> relu -> linear(2, 2)")
    chain = _Chain.of(arch)
    params = random_point(arch, torch.Generator().manual_seed(3))
    theta = torch.cat([params[n].reshape(-1) for n in chain.names])
    n = 2
    fields = _draw(chain, 3, n, torch.Generator().manual_seed(4), theta.dtype, bracket_only=True)
    ours = _evaluate(chain, fields, theta.expand(1, n, theta.numel()))[0]

    def generator(c, s):
        def phi(t):
            z, offset = c[0], 0
            for k, ((o, i), has_bias) in enumerate(zip(zip(chain.widths[1:], chain.widths), chain.bias)):
                z, offset = t[offset: offset + o * i].reshape(o, i) @ z, offset + o * i
                if has_bias:
                    z, offset = z + s * t[offset: offset + o], offset + o
                z = z if k + 1 == chain.depth or c[k + 1] is None else c[k + 1] * z
            return c[-1] @ z
        field = grad(phi)
        norm = field(theta).norm()
        return lambda t: field(t) / norm

    def bracket(x, y):
        def value(t):
            return jvp(y, (t,), (x(t),))[1] - jvp(x, (t,), (y(t),))[1]
        norm = value(theta).norm()
        return lambda t: value(t) / norm

    level2, coefficients = fields.inner, fields.inner.inner
    gens = [generator([None if c is None else c[0, j] for c in coefficients[0]], coefficients[1][0, j, 0])
            for j in range(4 * n)]
    randoms = [lambda t, j=j: bracket(gens[j], gens[j + 2 * n])(t) + level2.weight[0, j, 0] * gens[j](t)
               for j in range(2 * n)]
    for i in range(n):
        assert torch.allclose(ours[i], bracket(randoms[i], randoms[i + n])(theta), rtol=0, atol=1e-12)


def test_parameters_of_a_torch_module_are_accepted():
    arch = symalg.parse("linear(3, 5) -> relu -> linear(5, 2)")
    torch.manual_seed(1)
    module = symalg.to_module(arch)
    params = dict(module.named_parameters())
    result = compare_with_symmetries(arch, params=params)
    assert result.complete and result.laws.n_laws == 5
    assert result.laws.params["0.weight"].dtype == torch.float64


def test_an_analysis_of_a_traced_chain_gives_the_spec_result():
    """compare_with_symmetries takes the Analysis of either front end: a traced nn.Sequential is read back as its
    chain (same parameter names), and its symmetries count the same independent quantities as the spec's."""
    arch = symalg.parse("linear(3, 5) -> relu -> linear(5, 4) -> identity -> linear(4, 2)")
    module = symalg.to_module(arch, generator=torch.Generator().manual_seed(0))
    traced = symalg.derive(symalg.trace(module, (torch.randn(6, 3, dtype=torch.float64),)))
    assert traced.architecture is None
    from_trace, from_spec = compare_with_symmetries(traced), compare_with_symmetries(arch)
    assert from_trace.complete and from_spec.complete, (str(from_trace), str(from_spec))
    assert (from_trace.laws.n_laws, from_trace.symmetry_count) == (from_spec.laws.n_laws, from_spec.symmetry_count)
    assert from_trace.laws.ranks == from_spec.laws.ranks


def test_an_analysis_of_a_model_that_is_not_a_chain_is_refused_by_name():
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    model = Residual().double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(4, 3, dtype=torch.float64),)))
    with pytest.raises(SpecError, match="Analysis of a traced Residual, not of a dense chain"):
        compare_with_symmetries(analysis)
    tanh = symalg.derive(symalg.trace(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                                          torch.nn.Linear(4, 2)).double(),
                                      (torch.randn(4, 3, dtype=torch.float64),)))
    with pytest.raises(SpecError, match="activation 'tanh'"):
        compare_with_symmetries(tanh)


def test_invalid_input_raises_naming_the_argument():
    with pytest.raises(SpecError, match="tanh"):
        count_conservation_laws("linear(3, 4) -> tanh -> linear(4, 2)")
    with pytest.raises(SpecError, match="activation= and bias="):
        count_conservation_laws("linear(3, 4) -> relu -> linear(4, 2)", activation="relu")
    with pytest.raises(SpecError, match="activation="):
        count_conservation_laws([3, 4, 2], activation="gelu")
    for widths in ([3], [3, 0, 2], [3, 2.5, 2], 7):
        with pytest.raises(SpecError, match="widths"):
            count_conservation_laws(widths)
    with pytest.raises(SpecError, match="symbolic"):
        count_conservation_laws("linear(n, 4) -> relu -> linear(4, 2)")
    with pytest.raises(ValueError, match="max_level"):
        count_conservation_laws([3, 4, 2], max_level=0)
    with pytest.raises(ValueError, match="known_laws"):
        count_conservation_laws([3, 4, 2], known_laws=21)
    with pytest.raises(SpecError, match="missing"):
        count_conservation_laws([3, 4, 2], params={"0.weight": torch.zeros(4, 3)})


def _slow_grid():
    """Every width tuple of depth 2 and 3, every corner (widths in {2, 9}) of depth 4 and 200 random depth-4
    tuples (seed 0): 4,840 tuples, each linear and ReLU, with and without biases."""
    rng = random.Random(0)
    tuples = [w for q in (2, 3) for w in itertools.product(range(2, 10), repeat=q + 1)]
    tuples += list(itertools.product((2, 9), repeat=5))
    tuples += [tuple(rng.randint(2, 9) for _ in range(5)) for _ in range(200)]
    return [(w, a, b) for w in tuples for a in ("linear", "relu") for b in (False, True)]


@pytest.mark.slow
def test_grid_is_complete():
    """One test over the whole slow grid (parametrising would add 19,360 items to every collection)."""
    failures = []
    for widths, activation, bias in _slow_grid():
        result = compare_with_symmetries(widths, activation, bias)
        if not result.complete or result.laws.gap < 1e5:
            failures.append(f"{result} gap {result.laws.gap:.1e}")
    assert not failures, "\n".join(failures)
