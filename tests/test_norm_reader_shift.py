"""A linear map reading a gain-free LayerNorm's whole output may shift its rows along ``1``: ``1ᵀn = 0`` over the
normalised axis, so ``(W + c 1ᵀ) n = W n``. Derived as ``T1`` on a ``<reader>.columns`` site; every near miss
claims nothing there and a note names the node that breaks it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import symalg
from symalg.verification.certification import claim_errors


class Reader(torch.nn.Module):
    """``lin → norm → [between] → reader``, ``norm`` and ``between`` chosen by name."""

    def __init__(self, norm: str = "module", between: str = "none", reader: str = "module", d: int = 4):
        super().__init__()
        self.norm_kind, self.between, self.reader_kind, self.d = norm, between, reader, d
        self.inp = torch.nn.Linear(3, d)
        size = (2, d) if norm == "two_axes" else d
        self.norm = torch.nn.RMSNorm(d, elementwise_affine=False) if norm == "rms" else \
            torch.nn.LayerNorm(size, elementwise_affine=norm == "gain")
        self.beta = torch.nn.Parameter(torch.randn(d))
        width = {"cat": 2 * d, "slice": d - 1, "transpose": 2}.get(between, d)
        self.out = torch.nn.Linear(width, 2)
        self.other = torch.nn.Linear(3, width)
        self.lora = torch.nn.Parameter(torch.randn(2, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, d = self.inp(x), self.d
        n = F.layer_norm(h, (d,)) if self.norm_kind == "function" else \
            F.layer_norm(h, (d,), None, self.beta) if self.norm_kind == "bias" else self.norm(h)
        n = {"none": lambda: n, "relu": lambda: torch.relu(n), "dropout": lambda: F.dropout(n, 0.5, training=True),
             "add": lambda: n + h, "cat": lambda: torch.cat([n, h], -1), "slice": lambda: n[..., :d - 1],
             "transpose": lambda: n.transpose(1, 2)}[self.between]()
        if self.reader_kind == "lora":
            return F.linear(n, self.out.weight + self.lora, self.out.bias)
        if self.reader_kind == "matmul":
            return n @ self.out.weight.T
        if self.reader_kind == "shared":
            return self.out(n) + self.out(torch.tanh(self.other(x)))
        return self.out(n)


def _analysis(model: torch.nn.Module, shape: tuple[int, ...] = (5, 2, 3)) -> symalg.Analysis:
    torch.manual_seed(0)
    return symalg.derive(symalg.trace(model.double(), (torch.randn(*shape, dtype=torch.float64),)))


def _shifts(analysis: symalg.Analysis) -> list:
    return [s for s in analysis.symmetries if s.site.endswith(".columns")]


def _notes(analysis: symalg.Analysis) -> str:
    return "\n".join(str(n) for n in analysis.blocked + analysis.sites.restrictions)


@pytest.mark.parametrize("norm", ["module", "function"])
def test_gain_free_layer_norm_reader_shifts_its_rows(norm: str) -> None:
    torch.manual_seed(1)
    model = Reader(norm).double()
    analysis = _analysis(model)
    [shift] = _shifts(analysis)
    assert shift.group.name == "Translations(2, along 1)" and shift.site == "out.columns"
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    [direction] = [d for d in shift.translations[0].directions(params)][:1]
    assert torch.equal(direction["out.weight"], torch.tensor([[1.0] * 4, [0.0] * 4], dtype=torch.float64))
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    moved = dict(params, **{"out.weight": params["out.weight"] + torch.tensor([[3.0], [-2.0]], dtype=torch.float64)})
    error = (torch.func.functional_call(model, moved, (x,)) - model(x)).abs().max().item()
    assert error < 1e-12
    shifted = dict(params, **{"out.weight": params["out.weight"] + torch.randn(2, 4, dtype=torch.float64)})
    assert (torch.func.functional_call(model, shifted, (x,)) - model(x)).abs().max().item() > 1e-3  # not all moves
    quantity = shift.conserved
    assert quantity is not None and quantity.kind == "linear"
    assert all(e.holds for e in claim_errors(analysis))
    report = symalg.verify(analysis)
    assert report.passed and any(c.symmetry.endswith("out.columns") and c.check == "gd_drift" and c.passed
                                 for c in report.checks)


def test_row_sums_are_conserved_by_gradient_descent() -> None:
    """The linear quantity ``W 1`` does not move under a gradient step of any loss of the output."""
    torch.manual_seed(2)
    model = Reader().double()
    x = torch.randn(7, 2, 3, dtype=torch.float64)
    before = model.out.weight.sum(1).detach().clone()
    (model(x) ** 3).sum().backward()
    assert model.out.weight.grad is not None
    assert model.out.weight.grad.sum(1).abs().max().item() < 1e-12
    assert (model.out.weight - 0.1 * model.out.weight.grad).sum(1).sub(before).abs().max().item() < 1e-12


@pytest.mark.parametrize("norm, between, reader, where", [
    ("bias", "none", "module", "its bias makes its output sum to 1ᵀβ"),
    ("two_axes", "none", "module", "normalises over 2 axes"),
    ("module", "relu", "module", "node 'relu'"),
    ("module", "dropout", "module", "node 'dropout'"),
    ("module", "add", "module", "node 'add'"),
    ("module", "cat", "module", "node 'cat'"),
    ("module", "slice", "module", "node 'getitem'"),
    ("module", "transpose", "module", "node 'transpose'"),
    ("module", "none", "lora", "not as the input of one whole weight"),
    ("module", "none", "matmul", "node 'matmul'"),
])
def test_near_misses_claim_nothing_and_name_the_node(norm: str, between: str, reader: str, where: str) -> None:
    analysis = _analysis(Reader(norm, between, reader))
    assert _shifts(analysis) == []
    assert where in _notes(analysis), _notes(analysis)
    assert all(e.holds for e in claim_errors(analysis))


@pytest.mark.parametrize("norm", ["gain", "rms"])
def test_gain_and_rms_norm_are_near_misses(norm: str) -> None:
    """``1ᵀ(γ ⊙ n) ≠ 0`` and an RMS-normalised vector has no zero sum: no reader site at all; the shift is false."""
    torch.manual_seed(3)
    model = Reader(norm).double()
    if norm == "gain":   # a gain of ones would keep the shift: 1ᵀ(γ ⊙ n) = 0 only for a constant γ
        with torch.no_grad():
            model.norm.weight.normal_()
    analysis = _analysis(model)
    assert _shifts(analysis) == []
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    params = {k: v.detach() for k, v in model.named_parameters()}
    moved = dict(params, **{"out.weight": params["out.weight"] + torch.tensor([[1.0], [0.0]], dtype=torch.float64)})
    assert (torch.func.functional_call(model, moved, (x,)) - model(x)).abs().max().item() > 1e-3


def test_shared_reader_weight_is_no_symmetry() -> None:
    analysis = _analysis(Reader(reader="shared"))
    assert _shifts(analysis) == []
    assert all(e.holds for e in claim_errors(analysis))


def test_layer_norm_bias_without_gain_moves_with_the_site() -> None:
    """``F.layer_norm(x, s, None, β)``: ``LN(g x) + g β = g (LN(x) + β)`` for ``g`` in ``O(d)`` fixing ``1``, so
    ``β`` is bound to the site (it was left unmoved: a false claim the ``zero_sum`` fuzzer family found)."""
    analysis = _analysis(Reader("bias"))
    [orthogonal] = [s for s in analysis.symmetries if s.group.name.startswith("O(4)")]
    assert "beta" in {b.tensor for b in orthogonal.bindings}
    assert all(e.holds for e in claim_errors(analysis))
