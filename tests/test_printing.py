"""LaTeX and plain-text output of derived objects and of symalg's matrix-expression printers."""

import pytest
import sympy as sp

import symalg
from symalg.printing import latex, sstr
from symalg.report import describe, describe_latex

h = sp.Symbol("h", integer=True, positive=True)
d = sp.MatrixSymbol("d_1", 3, 1)
W = sp.MatrixSymbol("W_1", 3, 2)
V = sp.MatrixSymbol("V", 3, 2)

IMBALANCE = r"W_{1} W_{1}^{T} + b_{1} b_{1}^{T} - W_{2}^{T} W_{2}"


@pytest.fixture(scope="module")
def linear_analysis():
    return symalg.derive("linear(n, h) -> identity -> linear(h, m)")


@pytest.fixture(scope="module")
def relu_analysis():
    return symalg.derive("linear(n, h) -> relu -> linear(h, m)")


@pytest.fixture(scope="module")
def two_site_analysis():
    return symalg.derive("linear(n, h) -> relu -> linear(h, k) -> tanh -> linear(k, m)")


@pytest.fixture(scope="module")
def radial_analysis():
    return symalg.derive("linear(n, h) -> radial -> linear(h, m)")


# -- the printers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, expected", [
    (sp.DiagMatrix(d), r"\operatorname{diag}\left(d_{1}\right)"),
    (sp.OneMatrix(3, 1), r"\mathbf{1}"),
    (sp.OneMatrix(h, 1), r"\mathbf{1}"),
    (sp.DiagMatrix(d) * W, r"\operatorname{diag}\left(d_{1}\right) W_{1}"),
    (W.T * sp.OneMatrix(3, 1), r"W_{1}^{T} \mathbf{1}"),
    (sp.HadamardPower(W, 2) * sp.OneMatrix(2, 1), r"W_{1}^{\circ {2}} \mathbf{1}"),
    (sp.HadamardProduct(W, V), r"W_{1} \circ V"),
])
def test_latex_printer(expr, expected):
    assert latex(expr) == expected


def test_latex_printer_differs_from_sympy_only_where_documented():
    assert sp.latex(sp.DiagMatrix(d)) != latex(sp.DiagMatrix(d))
    assert "DiagMatrix" not in latex(sp.DiagMatrix(d).inverse() * W)
    assert latex(W * W.T) == sp.latex(W * W.T) == r"W_{1} W_{1}^{T}"


@pytest.mark.parametrize("expr, expected", [
    (sp.DiagMatrix(d), "diag(d_1)"),
    (sp.OneMatrix(3, 1), "1"),
    (sp.DiagMatrix(d) * W, "diag(d_1)*W_1"),
    (sp.HadamardPower(W, 2), "W_1∘^2"),
    (sp.HadamardPower(W + V, 2), "(V + W_1)∘^2"),
    (sp.HadamardProduct(W, V), "W_1∘V"),
    (sp.HadamardProduct(W + V, W), "(V + W_1)∘W_1"),
    (sp.HadamardPower(W, 2) * sp.OneMatrix(2, 1), "W_1∘^2*1"),
])
def test_str_printer(expr, expected):
    assert sstr(expr) == expected


# -- conserved quantities --------------------------------------------------------------------------
def test_conserved_quantity_latex_has_the_layer_imbalance(linear_analysis):
    quantity = linear_analysis.conserved_quantities()[0]
    text = quantity.latex()
    assert IMBALANCE in text
    assert text.startswith(r"Q_{M_{1}} = \operatorname{tr}\left(M_{1} C_{1}\right)")
    assert rf"C_{{1}} = {IMBALANCE}" in text


def test_conserved_quantity_repr_latex_wraps_in_dollars(linear_analysis):
    quantity = linear_analysis.conserved_quantities()[0]
    assert quantity._repr_latex_() == f"${quantity.latex()}$"


def test_conserved_quantity_without_bias():
    quantity = symalg.derive("linear(n, h, bias=False) -> identity -> linear(h, m)").conserved_quantities()[0]
    assert r"C_{1} = W_{1} W_{1}^{T} - W_{2}^{T} W_{2}" in quantity.latex()
    assert "b_" not in quantity.latex()
    assert str(quantity).startswith("C_1 = W_1*W_1.T - W_2.T*W_2")


def test_conserved_quantity_str(linear_analysis):
    assert str(linear_analysis.conserved_quantities()[0]).startswith("C_1 = W_1*W_1.T + b_1*b_1.T - W_2.T*W_2")


def test_positive_scaling_quantity_prints_ones_and_hadamard_powers(relu_analysis):
    quantity = relu_analysis.conserved_quantities()[0]
    assert quantity.latex() == (r"Q_{m_{1}} = m_{1}^{T} q_{1},\quad q_{1} = W_{1}^{\circ {2}} \mathbf{1} "
                                r"+ b_{1}^{\circ {2}} - \left(W_{2}^{T}\right)^{\circ {2}} \mathbf{1}")
    assert str(quantity).startswith("q_1 = W_1∘^2*1 + b_1∘^2 - W_2.T∘^2*1")


def test_homogeneous_degree_appears_in_the_quantity():
    quantity = symalg.derive("linear(n, h) -> relu_pow(alpha=3) -> linear(h, m)").conserved_quantities()[0]
    assert r"- 3 \left(W_{2}^{T}\right)^{\circ {2}} \mathbf{1}" in quantity.latex()
    assert "3*W_2.T∘^2*1" in str(quantity)


def test_angular_momentum_latex(radial_analysis):
    (momentum,) = radial_analysis.angular_momenta()
    text = momentum.latex()
    assert text.startswith("J_{1} = ") and text.endswith(r"= 0 \ \text{along gradient flow}")
    for term in (r"W_{1} \dot{W}_{1}^{T}", r"\dot{W}_{1} W_{1}^{T}", r"W_{2}^{T} \dot{W}_{2}", r"\dot{W}_{2}^{T} W_{2}",
                 r"b_{1} \dot{b}_{1}^{T}", r"\dot{b}_{1} b_{1}^{T}"):
        assert term in text
    assert momentum._repr_latex_() == f"${text}$"


def test_angular_momentum_str_is_plain_text(radial_analysis):
    # The plain-text form should not carry LaTeX markup (``\\dot{W}_{1}``) in its symbol names.
    (momentum,) = radial_analysis.angular_momenta()
    text = str(momentum)
    assert text.startswith("J_1 = ")
    assert "\\" not in text and "{" not in text


# -- symmetries and analyses -----------------------------------------------------------------------
def test_symmetry_latex_and_repr(relu_analysis):
    scaling, permutation = relu_analysis.symmetries
    text = scaling.latex()
    assert text.startswith(r"\text{site h1 (relu):}\ ")
    assert r"W_{1} \mapsto \operatorname{diag}\left(d_{1}\right) W_{1}" in text
    assert r"b_{1} \mapsto \operatorname{diag}\left(d_{1}\right) b_{1}" in text
    assert r"\delta W_{2} = - W_{2} \operatorname{diag}\left(m_{1}\right)" in text
    assert "DiagMatrix" not in text
    assert scaling._repr_latex_() == rf"$\begin{{gathered}}{text}\end{{gathered}}$"
    assert r"W_{2} \mapsto W_{2} g_{1}^{T}" in permutation.latex()
    assert r"\delta" not in permutation.latex()  # discrete: no infinitesimal action


def test_symmetry_str(relu_analysis):
    scaling, permutation = relu_analysis.symmetries
    assert str(scaling).startswith(f"h1:{scaling.group.name} (dim h): ")
    assert "W_1 -> diag(d_1)*W_1" in str(scaling)
    assert str(permutation) == f"h1:{permutation.group.name} (dim 0): W_2 -> W_2*g_1.T; W_1 -> g_1*W_1; b_1 -> g_1*b_1"


def test_analysis_latex_and_repr(linear_analysis):
    text = linear_analysis.latex()
    assert text.startswith(r"\text{site h1 (identity):}\ ")
    assert r"W_{1} \mapsto g_{1} W_{1}" in text and r"W_{2} \mapsto W_{2} g_{1}^{-1}" in text
    assert IMBALANCE in text
    assert linear_analysis._repr_latex_() == rf"$\begin{{gathered}}{text}\end{{gathered}}$"


@pytest.mark.parametrize("name", ["linear_analysis", "relu_analysis", "two_site_analysis", "radial_analysis"])
def test_str_of_analysis_mentions_everything(name, request):
    analysis = request.getfixturevalue(name)
    text = str(analysis)
    assert text == describe(analysis)
    assert text.splitlines()[0] == f"network: {symalg.to_spec_string(analysis.architecture)}"
    for site in analysis.sites:
        assert f"site {site.name} (width {site.width}, activation {site.op})" in text
        for group in site.groups:
            assert group.name in text
    for symmetry in analysis.symmetries:
        assert symmetry.label in text
    assert f"orbit dimension (generic): {sstr(analysis.orbit_dimension())}" in text
    for quantity in analysis.conserved_quantities():
        assert str(quantity) in text
    for momentum in analysis.angular_momenta():
        assert momentum.name in text


def test_str_of_analysis_formulas(linear_analysis, two_site_analysis):
    text = str(linear_analysis)
    assert "orbit dimension (generic): h**2 - (h - Min(h, m))*(h - Min(h, n + 1))" in text
    assert "C_1 = W_1*W_1.T + b_1*b_1.T - W_2.T*W_2" in text
    assert "W_1 -> g_1*W_1" in text and "dW_2 = -W_2*M_1" in text
    text = str(two_site_analysis)
    assert "site h1 (width h, activation relu)" in text and "site h2 (width k, activation tanh)" in text
    assert "orbit dimension (generic): h\n" in text
    assert "q_1 = W_1∘^2*1 + b_1∘^2 - W_2.T∘^2*1" in text


def test_str_of_analysis_mentions_blocked_symmetries():
    analysis = symalg.derive("linear(2, 3) -> sigmoid -> linear(3, 1, bias=False)")
    text = str(analysis)
    assert "blocked:" in text and "sign flips need a bias in layer 2" in text


# -- describe_latex --------------------------------------------------------------------------------
def _lines(text):
    assert text.startswith("\\begin{align*}\n") and text.endswith("\n\\end{align*}")
    return text[len("\\begin{align*}\n"):-len("\n\\end{align*}")].split(" \\\\\n")


def test_describe_latex_linear(linear_analysis):
    text = describe_latex(linear_analysis)
    lines = _lines(text)
    assert lines[0] == r"\text{orbit dimension} &= " + latex(linear_analysis.orbit_dimension())
    assert lines[0] == (r"\text{orbit dimension} &= h^{2} - \left(h - \min\left(h, m\right)\right) "
                        r"\left(h - \min\left(h, n + 1\right)\right)")
    assert r"&\text{h1: } \mathrm{GL}(h)" in lines
    assert r"W_{1} &\mapsto g_{1} W_{1}" in lines
    assert r"W_{2} &\mapsto W_{2} g_{1}^{-1}" in lines
    assert r"b_{1} &\mapsto g_{1} b_{1}" in lines
    assert lines[-1].startswith(r"Q_{M_{1}} &= \operatorname{tr}")
    assert rf"C_{{1}} = {IMBALANCE}" in lines[-1]
    for line in lines:  # align*-ready: one alignment point per line
        assert line.count("&") == 1, line


def test_describe_latex_positive_scaling(relu_analysis):
    lines = _lines(describe_latex(relu_analysis))
    assert lines[0] == r"\text{orbit dimension} &= h"
    assert r"W_{1} &\mapsto \operatorname{diag}\left(d_{1}\right) W_{1}" in lines
    assert r"&\text{h1: } S_{h}" in lines
    assert lines[-1].startswith(r"Q_{m_{1}} &= m_{1}^{T} q_{1}")
    assert r"\mathbf{1}" in lines[-1]
    assert all("DiagMatrix" not in line and "OneMatrix" not in line for line in lines)


def test_describe_latex_angular_momentum(radial_analysis):
    lines = _lines(describe_latex(radial_analysis))
    assert r"&\text{h1: } \mathrm{O}(h)" in lines
    assert lines[-1].startswith(r"J_{1} &= ")
    assert lines[-1].endswith(r"\text{along gradient flow}")


def test_describe_latex_without_closed_form_orbit():
    analysis = symalg.derive("linear(n, h) -> radial -> linear(h, k) -> identity -> linear(k, m)")
    lines = _lines(describe_latex(analysis))
    assert lines[0] == r"\text{orbit dimension: numeric only}"
    assert any(line.startswith(r"J_{1} &= ") for line in lines)
    assert any(line.startswith(r"Q_{M_{2}} &= ") and r"C_{2} = " in line for line in lines)


def test_describe_latex_concrete_widths():
    analysis = symalg.derive("linear(2, 3) -> leaky_relu(slope=0.2) -> linear(3, 1)")
    lines = _lines(describe_latex(analysis))
    assert lines[0] == r"\text{orbit dimension} &= 3"
    assert r"&\text{h1: } S_{3}" in lines
