"""LaTeX and plain-text output of derived objects and of symalg's matrix-expression printers."""

import shutil

import pytest
import sympy as sp
import torch

import symalg
import symalg.frontend.spec
from symalg.symbolic.printing import latex, sstr
from symalg.symbolic.report import describe, describe_latex

h = sp.Symbol("h", integer=True, positive=True)
d = sp.MatrixSymbol("d_1", 3, 1)
W = sp.MatrixSymbol("W_1", 3, 2)
V = sp.MatrixSymbol("V", 3, 2)

IMBALANCE = r"b_{0} b_{0}^{T} + W_{0} W_{0}^{T} - W_{2}^{T} W_{2}"  # C for the site of layer 0


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
    (sp.HadamardPower(d, -3), r"d_{1}^{\circ (-3)}"),
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


# -- conserved quantities ---------------------------------------------------------------------------
def test_parameter_names_print_as_readable_latex():
    W0, b0 = sp.MatrixSymbol("0.weight", 3, 2), sp.MatrixSymbol("0.bias", 3, 1)
    assert latex(W0 * W0.T + b0 * b0.T) == r"b_{0} b_{0}^{T} + W_{0} W_{0}^{T}"
    assert latex(sp.MatrixSymbol("encoder.fc_1.weight", 3, 2)) == r"W_{\mathrm{encoder.fc\_1}}"
    assert latex(sp.MatrixSymbol("0.weight[0:4]_(1)", 4, 2)) == r"\mathrm{0.weight[0:4]\_(1)}"
    assert sstr(W0 * W0.T) == "0.weight*0.weight.T"  # plain text keeps the name params are keyed by


def test_conserved_quantity_latex_has_the_layer_imbalance(linear_analysis):
    quantity = linear_analysis.conserved_quantities()[0]
    text = quantity.latex()
    assert IMBALANCE in text
    assert text.startswith(r"Q_{M} = \operatorname{tr}\left(M C_{0}\right)")
    assert rf"C_{{0}} = {IMBALANCE}" in text


def test_conserved_quantity_repr_latex_wraps_in_dollars(linear_analysis):
    quantity = linear_analysis.conserved_quantities()[0]
    assert quantity._repr_latex_() == f"${quantity.latex()}$"


def test_conserved_quantity_without_bias():
    quantity = symalg.derive("linear(n, h, bias=False) -> identity -> linear(h, m)").conserved_quantities()[0]
    assert r"C_{0} = W_{0} W_{0}^{T} - W_{2}^{T} W_{2}" in quantity.latex()
    assert "b_" not in quantity.latex()
    assert str(quantity) == "C__0 = 0.weight*0.weight.T - 2.weight.T*2.weight"


def test_conserved_quantity_str(linear_analysis):
    assert str(linear_analysis.conserved_quantities()[0]) == \
        "C__0 = 0.bias*0.bias.T + 0.weight*0.weight.T - 2.weight.T*2.weight"


def test_positive_scaling_quantity_prints_ones_and_hadamard_powers(relu_analysis):
    quantity = relu_analysis.conserved_quantities()[0]
    assert quantity.latex() == (r"Q_{m} = m^{T} q_{0},\quad q_{0} = b_{0}^{\circ {2}} + W_{0}^{\circ {2}} \mathbf{1} "
                                r"- \left(W_{2}^{T}\right)^{\circ {2}} \mathbf{1}")
    assert str(quantity) == "q__0 = 0.bias∘^2 + 0.weight∘^2*1 - 2.weight.T∘^2*1"


def test_homogeneous_degree_appears_in_the_quantity():
    quantity = symalg.derive("linear(n, h) -> relu_pow(alpha=3) -> linear(h, m)").conserved_quantities()[0]
    assert r"- 3 \left(W_{2}^{T}\right)^{\circ {2}} \mathbf{1}" in quantity.latex()
    assert "3*2.weight.T∘^2*1" in str(quantity)


def test_angular_momentum_latex(radial_analysis):
    (momentum,) = radial_analysis.angular_momenta()
    text = momentum.latex()
    assert text.startswith(r"J_{0} = G - G^{T}") and r"0 \text{ along gradient flow)}" in text
    assert momentum._repr_latex_() == f"${text}$"


def test_angular_momentum_str_is_plain_text(radial_analysis):
    # The plain-text form carries no LaTeX markup, and names the tensors it reads.
    (momentum,) = radial_analysis.angular_momenta()
    text = str(momentum)
    assert text.startswith("J__0 = G - G.T") and "over 0.weight, 0.bias, 2.weight" in text
    assert "\\" not in text and "{" not in text


# -- symmetries and analyses -----------------------------------------------------------------------
MOVES = "0.weight rows[0:h] (out); 0.bias rows[0:h] (out); 2.weight columns[0:h] (in)"


def test_symmetry_latex_and_repr(relu_analysis):
    scaling, permutation = relu_analysis.symmetries
    text = scaling.latex()
    assert text.startswith(r"(\mathbb{R}_{>0})^{h},\ \pi(g) = g^{1} \text{ on 0: } ")
    assert r"W_{0} \mapsto \operatorname{diag}\left(d\right) W_{0}" in text
    assert r"b_{0} \mapsto \operatorname{diag}\left(d\right) b_{0}" in text
    assert r"W_{2} \mapsto W_{2} \operatorname{diag}\left(d^{\circ (-1)}\right)" in text
    assert "DiagMatrix" not in text
    assert scaling._repr_latex_() == f"${text}$"
    assert permutation.latex() == (r"S_{h} \text{ on 0: } W_{0} \mapsto g W_{0},\ b_{0} \mapsto g b_{0},"
                                   r"\ W_{2} \mapsto W_{2} g^{T}")
    degree = symalg.derive("linear(n, h) -> relu_pow(alpha=3) -> linear(h, m)").symmetries[0]
    assert r"W_{2} \mapsto W_{2} \operatorname{diag}\left(d^{\circ (-3)}\right)" in degree.latex()


def test_affine_sign_flip_latex_shifts_the_next_bias():
    flips = symalg.derive("linear(n, h) -> sigmoid -> linear(h, m)").symmetries[0]
    assert flips.action_latex()[2:] == [r"W_{2} \mapsto W_{2} g",
                                        r"b_{2} \mapsto b_{2} - W_{2} g \left(- \frac{1}{2} g \mathbf{1} + "
                                        r"\left(\frac{1}{2}\right) \mathbf{1}\right)"]


class _TwiceEncoded(torch.nn.Module):
    """``head(enc_1(x)) + head(enc_1(x))``: the encoder's layer is called twice (sites ``enc_1.0``, ``enc_1.0#2``)."""

    def __init__(self):
        super().__init__()
        self.enc_1 = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.enc_1(x)) + self.head(self.enc_1(x))


def test_traced_sites_print_as_valid_latex():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    analysis = symalg.derive(symalg.from_torch(model, (torch.randn(5, 3, dtype=torch.float64),)))
    assert analysis.symmetries[0].latex().startswith(r"(\mathbb{Z}_2)^{4} \text{ on 0: } W_{0} \mapsto g W_{0}")
    assert r"&\text{0: } S_{4}" in describe_latex(analysis)
    # a module path keeps its dots and escapes its underscores, in text and in subscripts
    nested = symalg.derive(symalg.from_torch(_TwiceEncoded().double(), (torch.randn(5, 3, dtype=torch.float64),)))
    flips = nested.symmetries[0]
    assert (flips.site, flips.members) == ("enc_1.0", ("enc_1.0", "enc_1.0#2"))
    assert flips.latex().startswith(r"(\mathbb{Z}_2)^{4} \text{ on enc\_1.0: } W_{\mathrm{enc\_1.0}} \mapsto g W_{")
    assert r"&\text{enc\_1.0: } S_{4}" in describe_latex(nested)
    linear = symalg.derive("linear(3, 4) -> identity -> linear(4, 2)", loss="cross_entropy")
    assert [q.latex().split(" = ")[0] for q in linear.conserved_quantities()] == [
        r"Q_{M}", r"\ell_{2,\,\mathrm{2\_weight}}"]


def test_symmetry_str(relu_analysis):
    scaling, permutation = relu_analysis.symmetries
    assert str(scaling) == f"PositiveScaling(h, alpha=1) on 0: moves {MOVES}\n  conserved: {scaling.conserved}"
    assert str(permutation) == f"S(h) on 0: moves {MOVES}"  # discrete: no conserved quantity


def test_analysis_latex_and_repr(linear_analysis):
    text = linear_analysis.latex()
    assert text.startswith("\\begin{align*}\n& \\mathrm{GL}(h) \\text{ on 0: } W_{0} \\mapsto g W_{0},"
                           "\\ b_{0} \\mapsto g b_{0},\\ W_{2} \\mapsto W_{2} g^{-1} \\\\\n")
    assert rf"& Q_{{M}} = \operatorname{{tr}}\left(M C_{{0}}\right),\quad C_{{0}} = {IMBALANCE}" in text
    body = text[len("\\begin{align*}\n"):-len("\n\\end{align*}")]
    assert linear_analysis._repr_latex_() == f"$\\begin{{aligned}}\n{body}\n\\end{{aligned}}$"
    assert repr(linear_analysis) == "Analysis('linear(n, h) -> identity -> linear(h, m)': GL(h) on 0, Shears(h) on 0)"
    assert r"& \mathbb{R}^{h} \text{ on 0: } b_{0} \mapsto b_{0} + t,\ b_{2} \mapsto b_{2} - W_{2}\, t \\" in text


@pytest.mark.parametrize("name", ["linear_analysis", "relu_analysis", "two_site_analysis", "radial_analysis"])
def test_str_of_analysis_mentions_everything(name, request):
    analysis = request.getfixturevalue(name)
    text = str(analysis)
    assert text == describe(analysis)
    assert text.splitlines()[0] == f"model: {symalg.frontend.spec.to_spec_string(analysis.architecture)!r}"
    for symmetry in analysis.symmetries:
        assert f"  {symmetry.label}  [" in text
        for binding in symmetry.bindings:
            assert binding.describe() in text
    for note in analysis.sites.restrictions:
        assert f"restricted: {note}" in text
    assert f"orbit dimension (generic): {sstr(analysis.orbit_dimension())}" in text
    for quantity in analysis.conserved_quantities():
        assert str(quantity) in text
    for momentum in analysis.angular_momenta():
        assert f"angular momentum: {momentum}" in text
    assert text.splitlines()[-1] == analysis.certification_summary()


def test_str_of_analysis_formulas(linear_analysis, two_site_analysis):
    text = str(linear_analysis)
    assert "orbit dimension (generic): h**2 + h - (h - Min(h, m))*(h - Min(h, n))" in text
    assert "  Shears(h) on 0  [continuous, dim h]\n    moves 0.bias (entries); 2.bias absorbs −2.weight columns[0:h] " \
           "(in) t\n" in text
    assert "C__0 = 0.bias*0.bias.T + 0.weight*0.weight.T - 2.weight.T*2.weight" in text
    assert f"  GL(h) on 0  [continuous, dim h**2]\n    moves {MOVES}\n    Lie algebra of dim h**2" in text
    assert "conserved quantities: 1 family; functionally independent at generic θ: " in text
    text = str(two_site_analysis)
    assert "PositiveScaling(h, alpha=1) on 0  [continuous, dim h]" in text
    assert "SignFlips(k) on 2  [discrete, dim 0]" in text
    assert "moves 2.weight rows[0:k] (out); 2.bias rows[0:k] (out); 4.weight columns[0:k] (in)" in text
    assert "orbit dimension (generic): h\n" in text
    assert "q__0 = 0.bias∘^2 + 0.weight∘^2*1 - 2.weight.T∘^2*1" in text


def test_str_of_analysis_mentions_blocked_and_restricted_symmetries():
    text = str(symalg.derive("linear(2, 3) -> sigmoid -> linear(3, 1, bias=False)"))
    assert "SignFlips" not in text.split("restricted:")[0]
    assert ("restricted: 0 (node 2): SF removed: layer 2 (linear) has no bias to absorb the shift of an affine "
            "sign flip") in text
    opaque = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Softsign(), torch.nn.Linear(4, 2))
    text = str(symalg.derive(symalg.parse(opaque)))
    assert "blocked: 0 (node 1): " in text and "op 'Softsign' is not in the equivariance catalogue" in text
    assert "symmetries:\n  none" in text


# -- describe_latex --------------------------------------------------------------------------------
def _lines(text):
    assert text.startswith("\\begin{align*}\n") and text.endswith("\n\\end{align*}")
    return text[len("\\begin{align*}\n"):-len("\n\\end{align*}")].split(" \\\\\n")


def test_describe_latex_linear(linear_analysis):
    text = describe_latex(linear_analysis)
    lines = _lines(text)
    assert lines[0] == r"\text{orbit dimension} &= " + latex(linear_analysis.orbit_dimension())
    assert lines[0] == (r"\text{orbit dimension} &= h^{2} + h - \left(h - \min\left(h, m\right)\right) "
                        r"\left(h - \min\left(h, n\right)\right)")
    assert lines[5:8] == [r"&\text{0: } \mathbb{R}^{h}", r"&\quad b_{0} \mapsto b_{0} + t",
                          r"&\quad b_{2} \mapsto b_{2} - W_{2}\, t"]
    assert lines[1:5] == [r"&\text{0: } \mathrm{GL}(h)", r"&\quad W_{0} \mapsto g W_{0}",
                          r"&\quad b_{0} \mapsto g b_{0}",
                          r"&\quad W_{2} \mapsto W_{2} g^{-1}"]
    assert lines[-1].startswith(r"Q_{M} &= \operatorname{tr}\left(M C_{0}\right)")
    assert rf"C_{{0}} = {IMBALANCE}" in lines[-1]
    for line in lines:  # align*-ready: one alignment point per line
        assert line.count("&") == 1, line


def test_describe_latex_positive_scaling(relu_analysis):
    lines = _lines(describe_latex(relu_analysis))
    assert lines[0] == r"\text{orbit dimension} &= h"
    assert r"&\text{0: } (\mathbb{R}_{>0})^{h},\ \pi(g) = g^{1}" in lines
    assert r"&\text{0: } S_{h}" in lines
    assert r"&\quad W_{0} \mapsto \operatorname{diag}\left(d\right) W_{0}" in lines
    assert lines[-1].startswith(r"Q_{m} &= m^{T} q_{0}")
    assert r"\mathbf{1}" in lines[-1]
    assert all("DiagMatrix" not in line and "OneMatrix" not in line for line in lines)


def test_describe_latex_angular_momentum(radial_analysis):
    lines = _lines(describe_latex(radial_analysis))
    assert r"&\text{0: } \mathrm{O}(h)" in lines
    assert lines[-1].startswith(r"J_{0} &= ")
    assert lines[-1].endswith(r"\text{ along gradient flow)}")


def test_describe_latex_without_closed_form_orbit():
    analysis = symalg.derive("linear(n, h) -> radial -> linear(h, k) -> identity -> linear(k, m)")
    lines = _lines(describe_latex(analysis))
    assert lines[0] == r"\text{orbit dimension: numeric only}"
    assert any(line.startswith(r"J_{0} &= ") for line in lines)
    assert any(line.startswith(r"Q_{M} &= ") and r"C_{2} = " in line for line in lines)


def test_describe_latex_concrete_widths():
    analysis = symalg.derive("linear(2, 3) -> leaky_relu(slope=0.2) -> linear(3, 1)")
    lines = _lines(describe_latex(analysis))
    assert lines[0] == r"\text{orbit dimension} &= 3"
    assert r"&\text{0: } S_{3}" in lines


@pytest.mark.parametrize("make", ["spec", "symbolic", "traced"])
def test_to_dict_is_json_for_every_front_end(make):
    import json

    if make == "traced":
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
        analysis = symalg.derive(symalg.from_torch(model, (torch.randn(5, 3, dtype=torch.float64),)),
                                 loss="cross_entropy")
    else:
        spec = "linear(3, 4) -> relu -> linear(4, 2)" if make == "spec" else "linear(n, h) -> relu -> linear(h, m)"
        analysis = symalg.derive(spec, loss="cross_entropy")
    summary = json.loads(json.dumps(analysis.to_dict()))
    assert [s["group"] for s in summary["symmetries"]] == [s.group.name for s in analysis.symmetries]
    assert summary["loss"] == "cross_entropy" and summary["orbit_dimension"] == str(analysis.orbit_dimension())
    assert (summary["certification"] is None) == (make == "symbolic")


def test_report_lists_the_basis_of_small_concrete_groups():
    """The first basis matrices of a small algebra are printed, and they are the group's own basis."""
    text = describe(symalg.derive("linear(2, 2) -> identity -> linear(2, 1)"))
    gl_basis = symalg.derive("linear(2, 2) -> identity -> linear(2, 1)").symmetries[0].group.algebra_basis()
    shown = ", ".join(str(b.to(int).tolist()) for b in gl_basis)
    assert f"basis: {shown} (4 in all)" in text
    relu = describe(symalg.derive("linear(2, 3) -> relu -> linear(3, 1)"))
    assert "basis: diag([1, 0, 0]), diag([0, 1, 0]), diag([0, 0, 1]) (3 in all)" in relu


def test_report_lists_no_basis_for_large_or_symbolic_groups():
    """GL(9) has an 81-dimensional algebra (over the listing limit) and GL(h) no concrete basis: no listing."""
    assert "basis:" not in describe(symalg.derive("linear(2, 9) -> identity -> linear(9, 1, bias=False)"))
    assert "basis:" not in describe(symalg.derive("linear(n, h) -> identity -> linear(h, m)"))


# -- the LaTeX compiles with a real engine -----------------------------------------------------------
class _Named(torch.nn.Module):
    """Parameter and site names with dots and underscores (``enc_0.0.weight``, ``blocks.0.2.bias``), module keys
    holding LaTeX's special characters, a norm without gains (an orthogonal group and its angular momentum) and
    a bias-free layer after it (translations)."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.enc_0 = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 4))
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 5), nn.LayerNorm(5, elementwise_affine=False),
                                                   nn.Linear(5, 4))])
        self.heads = nn.ModuleDict({"a&b_1": nn.Linear(4, 4), "x^2~%$#{}é": nn.Linear(4, 2)})

    def forward(self, x):
        x = self.blocks[0](torch.relu(self.enc_0(x)))
        return self.heads["x^2~%$#{}é"](torch.relu(self.heads["a&b_1"](x)))


def _gpt_block():
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "gpt_block.py"))
    return symalg.derive(symalg.trace(example["model"], example["example_inputs"]))


LATEX_ANALYSES = {
    "spec-symbolic": lambda: symalg.derive("linear(n, h) -> relu -> linear(h, k) -> radial -> linear(k, m)"),
    "spec-concrete": lambda: symalg.derive("linear(3, 4) -> sigmoid -> linear(4, 5)", loss="cross_entropy"),
    "traced-named": lambda: symalg.derive(symalg.from_torch(_Named(), (torch.randn(6, 3),))),
    "gpt-block": _gpt_block,
}


needs_pdflatex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed (Debian: "
                                    "apt-get install texlive-latex-base texlive-latex-recommended)")


def _pdflatex(body: str, directory) -> str:
    """Compile ``body`` in a minimal amsmath document with ``pdflatex``; ``""`` on success, else its errors."""
    import subprocess

    source = directory / "report.tex"
    source.write_text("\\documentclass{article}\n\\usepackage{amsmath,amssymb}\n\\begin{document}\n"
                      f"{body}\n\\end{{document}}\n", encoding="utf-8")
    run = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape",
                          source.name], cwd=directory, capture_output=True, text=True, timeout=120)
    if run.returncode == 0 and (directory / "report.pdf").exists():
        return ""
    log = (directory / "report.log").read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(line for i, line in enumerate(log) if line.startswith("!") or i and log[i - 1].startswith("!"))


@pytest.mark.latex
@needs_pdflatex
@pytest.mark.parametrize("name", LATEX_ANALYSES)
def test_every_latex_output_compiles_with_pdflatex(name, tmp_path):
    analysis = LATEX_ANALYSES[name]()
    quantities, momenta = analysis.conserved_quantities(), analysis.angular_momenta()
    pieces = [analysis.latex(), describe_latex(analysis), analysis._repr_latex_()]
    pieces += [item._repr_latex_() for item in (*analysis.symmetries, *quantities, *momenta)]
    assert _pdflatex("\n\n".join(pieces), tmp_path) == ""
    if name == "traced-named":  # the names this test is about reached the output
        assert r"W_{\mathrm{enc\_0.0}}" in analysis.latex() and momenta
        assert r"\mathrm{heads.x\text{\textasciicircum}2\text{\textasciitilde}\%\$\#\{\}\text{é}}" in analysis.latex()


@pytest.mark.latex
@needs_pdflatex
def test_pdflatex_reports_what_fails_to_compile(tmp_path):
    assert "Double subscript" in _pdflatex(r"$J_{\mathrm{blocks_0_0}}$", tmp_path)
