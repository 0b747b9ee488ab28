"""Models taking keyword inputs and returning structured outputs, through both tracers.

``symalg.trace``/``from_torch`` take keyword example inputs (tensors are inputs, plain values constants the
trace is specialised on) and pass them again whenever the model runs; every tensor a model returns (caches
held in an object's attributes included) is an output that claims are certified and verified against.
"""
import dataclasses

import pytest
import torch
from torch import nn

import symalg
from symalg.errors import SpecError
from symalg.frontend.outputs import output_tensors
from symalg.verification.certification import CERTIFICATION_TOLERANCE, claim_errors, fresh_inputs


class Gated(nn.Module):
    """``fc2(act(fc1(x))) + proj(context)``: ``context`` a keyword tensor input (no default), ``smooth`` a
    constant choosing ``act``."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.proj = nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2)

    def forward(self, x, context, smooth=False):
        h = self.fc1(x)
        h = torch.tanh(h) if smooth else torch.relu(h)
        return self.fc2(h) + self.proj(context)


class Cache:
    """A key/value-cache-like object: tensors in plain attributes, no container protocol."""

    def __init__(self, hidden):
        self.hidden, self.offloading = hidden, False


class ReturnsCache(nn.Module):
    """``(fc2(relu(h)), Cache(h))`` with ``h = fc1(x)``: the hidden pre-activations are an output."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x, use_cache=True):
        h = self.fc1(x)
        y = self.fc2(torch.relu(h))
        return (y, Cache(h)) if use_cache else (y,)


def _x():
    return torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("tracer", ["fx", "export"])
def test_keyword_constants_specialise_the_trace_and_tensors_are_inputs(tracer):
    model, x = Gated().double(), _x()
    context = torch.ones(5, 2, dtype=torch.float64)
    ops = {}
    for smooth in (False, True):
        graph = symalg.trace(model, (x,), tracer=tracer, context=context, smooth=smooth)
        assert graph.tracer == tracer and graph.example_kwargs == {"context": context, "smooth": smooth}
        ops[smooth] = [graph.node(v)["op"] for v in graph.nodes]
    assert "relu" in ops[False] and "tanh" not in ops[False]
    assert "tanh" in ops[True] and "relu" not in ops[True]
    assert [graph.node(v)["op"] for v in graph.nodes if graph.graph.out_degree(v)].count("input") == 2  # x, context


def test_keyword_inputs_are_passed_whenever_the_model_runs():
    """``context`` has no default: certification and every check of ``verify`` run the model, so they pass it."""
    model, x = Gated().double(), _x()
    context = torch.rand(5, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    analysis = symalg.derive(symalg.from_torch(model, x=x, context=context))
    assert analysis.model_graph.tracer == "fx" and analysis.model_graph.example_inputs == ()
    assert [s.label for s in analysis.symmetries] == ["PositiveScaling(4, alpha=1) on fc1", "S(4) on fc1"]
    assert analysis.certification is not None and all(e.holds for e in analysis.certification)
    report = symalg.verify(analysis)
    assert report.passed and {c.check for c in report.checks} >= {"invariance", "gradient_orthogonality"}


def test_fresh_inputs_keep_the_kind_of_the_examples():
    generator = torch.Generator().manual_seed(0)
    drawn = fresh_inputs({"ids": torch.tensor([[3, 9]]), "mask": torch.ones(1, 2, dtype=torch.bool),
                          "use_cache": False}, generator)
    assert set(drawn) == {"ids", "mask", "use_cache"} and drawn["use_cache"] is False
    assert drawn["ids"].dtype == torch.long and 3 <= int(drawn["ids"].min()) <= int(drawn["ids"].max()) <= 9
    assert isinstance(fresh_inputs((torch.zeros(2, 3),), generator), tuple)


def test_an_object_holding_tensors_is_flattened_with_its_paths():
    h = torch.ones(2)

    @dataclasses.dataclass
    class Output:
        logits: torch.Tensor
        past_key_values: object

    out = Output(torch.zeros(2), Cache(h))
    out.past_key_values.self_ref = out.past_key_values  # a cycle is read once
    assert [p for p, _ in output_tensors(out)] == ["logits", "past_key_values.hidden"]
    assert output_tensors(nn.Linear(2, 2)) == []  # a module's parameters are not outputs


def test_a_returned_cache_counts_as_an_output():
    """The hidden site's scalings and permutations hold for ``y`` but change the cached ``h``: not claimed with
    the cache, claimed without it, and the claims made without it fail on the cached output."""
    model, x = ReturnsCache().double(), _x()
    cached = symalg.derive(symalg.trace(model, (x,)))  # fx cannot return a Cache; export's outputs are flat
    assert cached.model_graph.tracer == "export" and cached.model_graph.output_paths == ("0", "1.hidden")
    assert cached.symmetries == () and all(e.holds for e in cached.certification)
    plain = symalg.derive(symalg.trace(model, (x,), use_cache=False))
    assert plain.model_graph.tracer == "fx"
    assert [s.label.split(" on ")[0] for s in plain.symmetries] == ["PositiveScaling(4, alpha=1)", "S(4)"]
    transplanted = dataclasses.replace(plain, model_graph=cached.model_graph)
    errors = claim_errors(transplanted)
    assert all(e.error > 1e3 * CERTIFICATION_TOLERANCE and e.output == "1.hidden" for e in errors)
    report = symalg.verify(transplanted)
    failed = [c for c in report.checks if c.check == "invariance" and not c.passed]
    assert len(failed) == 2 and all("'1.hidden'" in c.detail for c in failed)


def test_export_names_the_output_that_fixes_a_site():
    model, x = ReturnsCache().double(), _x()
    analysis = symalg.derive(symalg.trace(model, (x,), tracer="export"))
    notes = [str(note) for note in analysis.sites.restrictions]
    assert any("the model output '1.hidden' is fixed by the loss" in note for note in notes)


def test_the_analysis_says_which_tracer_ran_and_why():
    class Branchy(nn.Module):  # control flow on a shape: fx fails, export specialises on the example's shape
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x) if x.shape[0] > 1 else -self.fc(x)

    analysis = symalg.derive(symalg.from_torch(Branchy().double(), (_x(),)))
    summary = analysis.to_dict()
    assert summary["tracer"] == "export" and summary["outputs"] == ["output"]
    assert summary["tracer_note"].startswith("torch.fx failed (TraceError: symbolically traced variables cannot be")
    assert f"tracer: export ({summary['tracer_note']})" in str(analysis)
    fx = symalg.derive(symalg.from_torch(Gated().double(), (_x(),), context=torch.ones(5, 2))).to_dict()
    assert fx["tracer"] == "fx" and fx["tracer_note"] == ""


@pytest.mark.parametrize("kwargs, message", [
    (dict(context=torch.full((5, 2), float("nan"))), "example input 'context' has non-finite entries"),
    (dict(context=torch.ones(0, 2)), r"example input 'context' is empty \(shape \(0, 2\)\)"),
    (dict(context=[1.0, 2.0]), "keyword example input 'context' must be a tensor or a constant .* got list"),
    (dict(contexts=torch.ones(5, 2)), "failed in Gated: TypeError: missing a required argument: 'context'"),
    (dict(context=torch.ones(5, 3, dtype=torch.float64)),
     "failed in module 'proj' \\(Linear\\): RuntimeError: mat1 and mat2 shapes"),
])
def test_bad_keyword_inputs_are_refused_by_name(kwargs, message):
    with pytest.raises(SpecError, match=message):
        symalg.from_torch(Gated().double(), (_x(),), **kwargs)
