"""Numerical certification of claimed symmetries on the model itself.

A claim ``θ ↦ g·θ`` holds when ``F(g·θ, x) = F(θ, x)`` for every output of ``F``, every input ``x`` and
every ``g`` of the group. :func:`claim_errors` measures the worst relative change of any output over

* test elements of each group (:meth:`~symalg.catalogue.groups.SiteGroup.sample`): ``exp(M)`` with ``‖M‖`` near
  ``10⁻³`` and ``1``, every discrete generator (random sign patterns for wide ``SignFlips``), and an element of
  another component; drawn anew for each draw of inputs;
* fresh inputs drawn like the example inputs (:func:`fresh_inputs`), several draws;
* the model's parameters **and buffers** (eval-mode running statistics move with some actions), in
  float64, with stochastic ops (dropout) drawing the same noise for ``θ`` and ``g·θ``.

With ``loss="cross_entropy"`` the first output is the logits and is compared after ``softmax`` (the
loss's own invariance); every other output is compared as it is.

Claims are checked together: the composition of symmetries is a symmetry, so one forward pass checks a whole
set of claims composed. The sets of a round separate every two claims (:func:`check_in_separating_sets`:
``4⌈log₄ n⌉`` passes for ``n`` claims), so two false claims whose composition holds (one tie split in two, moved
by the same discrete generator) are never certified together; a failing set is halved until its failing claims
stand alone. The verdict is one relative error per claim (:class:`ClaimError`): the worst error of the composed
sets it passed in, or its own error where it failed alone.

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
>>> analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),)))
>>> [e.holds for e in claim_errors(analysis)]
[True, True]
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, overload

import torch
from torch.func import functional_call

from symalg.catalogue.groups import Device, SiteGroup
from symalg.frontend.grammar import check_entries
from symalg.frontend.outputs import output_tensors
from symalg.ir.graph import ModelGraph
from symalg.numeric.linalg import relative_error

if TYPE_CHECKING:  # for the annotation only
    from symalg.symbolic.symmetry import Symmetry

__all__ = ["ClaimError", "CERTIFICATION_TOLERANCE", "certification_tolerance", "assert_claims_hold", "claim_errors",
           "check_in_separating_sets", "compose", "fresh_inputs", "output_change", "sample_elements",
           "separating_sets"]

CERTIFICATION_TOLERANCE = 1e-8
"""Largest relative change of any output (float64) a certified claim may cause; false claims found by
the fuzzer change outputs by 0.1 to 5."""

ROUNDING_UNITS = 100
"""A model that casts to a lower floating precision inside (Hugging Face's RMS norms compute in float32) rounds
there whatever the parameters' dtype: its claims are held to ``ROUNDING_UNITS`` units of that precision."""


def certification_tolerance(graph: ModelGraph) -> float:
    """The tolerance the claims of ``graph``'s model are certified to: :data:`CERTIFICATION_TOLERANCE`, or
    :data:`ROUNDING_UNITS` units in the last place of the lowest floating precision the model casts to
    (``x.to(torch.float32)``: ``100 · 2⁻²³ ≈ 1.2e-5``), which rounding alone reaches. False claims change outputs
    by 0.1 to 5, so the margin stays four orders of magnitude.

    >>> import torch, symalg
    >>> class Cast(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x.to(torch.float32).to(torch.float64)
    >>> certification_tolerance(symalg.trace(torch.nn.Sequential(torch.nn.Linear(2, 2), Cast()), (torch.ones(1, 2),)))
    1.1920928955078125e-05
    """
    cast = [value for _, data in graph.graph.nodes(data=True) for value in data.get("arguments", {}).values()
            if isinstance(value, torch.dtype) and value.is_floating_point]
    rounding = max((ROUNDING_UNITS * torch.finfo(dtype).eps for dtype in cast), default=0.0)
    return max(CERTIFICATION_TOLERANCE, rounding)

class Certifiable(Protocol):
    """What :func:`claim_errors` reads of an analysis (a :class:`~symalg.symbolic.derive.Analysis`; that module
    imports this one, so certification names the surface it uses)."""

    @property
    def symmetries(self) -> Sequence[Symmetry]: ...
    @property
    def model_graph(self) -> ModelGraph: ...
    @property
    def loss(self) -> str: ...


@dataclass(frozen=True)
class ClaimError:
    """The worst relative output change one claim caused: ``error`` under ``element`` on ``output``."""

    symmetry: Symmetry
    error: float
    element: str = ""
    output: str = ""
    tolerance: float = CERTIFICATION_TOLERANCE
    """The model's :func:`certification_tolerance`."""

    @property
    def holds(self) -> bool:
        return self.error <= self.tolerance

    def __str__(self) -> str:
        return f"{self.symmetry.label}: relative error {self.error:.2e} on output {self.output!r} under {self.element}"


def sample_elements(group: SiteGroup, generator: torch.Generator, dtype: torch.dtype = torch.float64,
                    device: Device = "cpu") -> list[tuple[str, torch.Tensor]]:
    """The test elements of ``group``: :meth:`~symalg.catalogue.groups.SiteGroup.sample` (every discrete generator,
    ``exp(M)`` near and far from the identity, another component; random sign patterns for wide sign flips).
    A group whose elements are dense ``h × h`` matrices is refused above the entry limit of the grammar."""
    if group.element_format == "matrix":
        width = int(group.width)
        check_entries(width ** 2, f"a group acting on a site of width {width} (its {width}×{width} matrices)")
    return group.sample(generator, dtype, device)


@overload
def fresh_inputs(example_inputs: Mapping[str, Any], generator: torch.Generator, dtype: torch.dtype = ...,
                 device: Device = ...) -> dict[str, Any]: ...
@overload
def fresh_inputs(example_inputs: Sequence[Any], generator: torch.Generator, dtype: torch.dtype = ...,
                 device: Device = ...) -> tuple[Any, ...]: ...
def fresh_inputs(example_inputs: Sequence[Any] | Mapping[str, Any], generator: torch.Generator,
                 dtype: torch.dtype = torch.float64, device: Device = "cpu") -> tuple[Any, ...] | dict[str, Any]:
    """Inputs shaped like ``example_inputs`` (a sequence of positional inputs, or a mapping of keyword inputs:
    the same kind comes back), drawn anew: floating tensors from ``N(0, s²)`` with ``s`` the example's standard
    deviation (1 when it has none); integer tensors (token ids) uniformly between the example's minimum and
    maximum; booleans (masks) and non-tensors (``use_cache=False``) kept as given.

    >>> fresh_inputs({"ids": torch.tensor([3, 5]), "use_cache": False}, torch.Generator().manual_seed(0))["use_cache"]
    False
    """
    if isinstance(example_inputs, Mapping):
        return {k: _fresh(x, generator, dtype, device) for k, x in example_inputs.items()}
    return tuple(_fresh(x, generator, dtype, device) for x in example_inputs)


def _fresh(x: object, generator: torch.Generator, dtype: torch.dtype, device: Device) -> object:
    """One input drawn anew like ``x`` (see :func:`fresh_inputs`)."""
    if not isinstance(x, torch.Tensor) or x.dtype == torch.bool or x.numel() == 0:
        return x.to(device) if isinstance(x, torch.Tensor) else x
    if torch.is_floating_point(x):
        scale = x.double().std().item() if x.numel() > 1 else 1.0
        scale = scale if scale > 0 and scale == scale else 1.0
        return (scale * torch.randn(x.shape, generator=generator, dtype=torch.float64)).to(device, dtype)
    low, high = int(x.min()), int(x.max())
    return torch.randint(low, high + 1, x.shape, generator=generator, dtype=x.dtype).to(device)


def _forward(model: torch.nn.Module, state: Mapping[str, torch.Tensor], inputs: tuple[Any, ...],
             kwargs: Mapping[str, Any], parameters: set[str], seed: int,
             device: Device = "cpu") -> list[tuple[str, torch.Tensor]]:
    """All outputs of ``model`` at ``state`` (buffers copied: training-mode statistics update copies), with the
    random number generators seeded so that stochastic ops draw the same noise at every call: on the CPU its
    generator alone (``torch.manual_seed`` also seeds every accelerator's, through a lazy call that records a
    stack trace: 2 ms, more than the forward pass of a small model)."""
    values = {k: v if k in parameters else v.clone() for k, v in state.items()}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        (torch.default_generator.manual_seed if torch.device(device).type == "cpu" else torch.manual_seed)(seed)
        return output_tensors(functional_call(model, values, inputs, dict(kwargs)))


def compose(state: Mapping[str, torch.Tensor],
            claims: Sequence[tuple[Symmetry, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``state`` moved by every ``(symmetry, g)`` of ``claims`` in turn, for elements ``g`` the groups drew themselves
    (:func:`sample_elements`: not checked again). Each tensor a claim moves is copied once and moved in place, and each
    claim sees only the tensors it touches, so composing ``n`` claims costs their moves, not ``n`` copies of ``state``
    (a model with thousands of tensors and of claims); the other tensors are shared with ``state``.

    >>> import torch, symalg
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)).double()
    >>> scaling = symalg.derive(symalg.trace(model, (torch.randn(4, 2, dtype=torch.float64),))).symmetries[0]
    >>> state = dict(model.named_parameters())
    >>> moved = compose(state, [(scaling, torch.full((3,), 2.0, dtype=torch.float64))])
    >>> torch.equal(moved["0.bias"], 2 * state["0.bias"]), moved["2.bias"] is state["2.bias"]
    (True, True)
    """
    moved = dict(state)
    for name in {t for symmetry, _ in claims for t in symmetry.tensors}:
        moved[name] = state[name].detach().clone()
    for symmetry, g in claims:
        read = (*symmetry.reads, *(absorber.weight for absorber, _ in symmetry.shifts))   # weights a move reads
        touched = {t: moved[t] for t in (*symmetry.tensors, *read)}
        moved.update(symmetry.apply(touched, g, inplace=True, checked=False))
    return moved


def output_change(moved: Sequence[tuple[str, torch.Tensor]], reference: Sequence[tuple[str, torch.Tensor]],
                  cross_entropy: bool) -> tuple[float, str]:
    """``(worst relative change, output path)`` between two :func:`~symalg.frontend.outputs.output_tensors` lists:
    every output compared (the first one as ``softmax`` for cross-entropy); non-float outputs must be
    equal, a different structure or a NaN counts as ``inf``. Non-finite entries (a causal mask's ``-inf``
    in returned scores) must stay where they are, with their values; the finite ones are compared
    relatively."""
    if [p for p, _ in moved] != [p for p, _ in reference] or \
            any(a.shape != b.shape for (_, a), (_, b) in zip(moved, reference)):
        return float("inf"), "the structure of the outputs"
    worst, where = 0.0, ""
    for index, ((path, a), (_, b)) in enumerate(zip(moved, reference)):
        if not torch.is_floating_point(b) and not torch.is_complex(b):
            error = 0.0 if torch.equal(a, b) else float("inf")
        else:
            if cross_entropy and index == 0:
                a, b = a.softmax(-1), b.softmax(-1)
            finite = b.isfinite()
            if finite.all():
                error = relative_error(a, b)
            elif torch.equal(a.isfinite(), finite) and torch.equal(a.isnan(), b.isnan()) and \
                    torch.equal(a[b.isinf()], b[b.isinf()]):
                error = relative_error(a[finite], b[finite]) if finite.any() else 0.0
            else:
                error = float("inf")
            error = error if error == error else float("inf")  # NaN: the claim broke the output
        if error > worst or not where:
            worst, where = error, path
    return worst, where


SPLIT_BASE = 4
"""Claims are composed in ``SPLIT_BASE`` sets per digit of their positions written in this base
(:func:`check_in_separating_sets`): ``4 log₄ n`` forward passes and ``n log₄ n`` moves per round, the fewest in all
for a deep model (base 2: as many passes, twice the moves)."""


def separating_sets(count: int) -> list[list[int]]:
    """Sets of the positions ``0 … count − 1`` such that any two positions lie apart in some set: the positions
    sharing each digit value, for every digit of their base-:data:`SPLIT_BASE` numerals (at most ``4⌈log₄ n⌉``
    sets, the empty ones left out), or the positions one by one where that is no more sets.

    >>> separating_sets(3)
    [[0], [1], [2]]
    >>> [len(s) for s in separating_sets(20)], all(any((i in s) != (j in s) for s in separating_sets(20))
    ...                                            for i in range(20) for j in range(i))
    ([5, 5, 5, 5, 8, 4, 4, 4, 16, 4], True)
    """
    digits = 1
    while SPLIT_BASE ** digits < count:
        digits += 1
    if count <= SPLIT_BASE * digits:
        return [[i] for i in range(count)]
    sets = [[i for i in range(count) if i // SPLIT_BASE ** digit % SPLIT_BASE == value]
            for digit in range(digits) for value in range(SPLIT_BASE)]
    return [members for members in sets if members]


def check_in_separating_sets(count: int, change: Callable[[list[int]], tuple[float, str]], tolerance: float,
                             record: Callable[[list[int], float, str], None]) -> set[int]:
    """Check ``count`` claims composed in :func:`separating_sets`; return the positions of those that fail alone.

    ``change(members)`` is the error (and where it was measured) with the claims at ``members`` composed. A set within
    ``tolerance`` holds for every member; a failing set is halved until its failing claims stand alone, and a claim
    that failed alone leaves the later sets. ``record(members, error, where)`` is called for every set that passed
    and for every claim that failed alone (``members`` of one). Any two claims lie apart in some set, so two false
    claims whose composition holds cannot pass together.
    """
    failed: set[int] = set()

    def settle(members: list[int]) -> None:
        members = [i for i in members if i not in failed]
        if not members:
            return
        error, where = change(members)
        if not error <= tolerance and len(members) > 1:
            settle(members[:len(members) // 2])
            settle(members[len(members) // 2:])
            return
        if not error <= tolerance:
            failed.add(members[0])
        record(members, error, where)

    for members in separating_sets(count):
        settle(members)
    return failed


def claim_errors(analysis: Certifiable, inputs: tuple[Any, ...] | None = None, draws: int = 2, seed: int = 0,
                 device: Device = "cpu", symmetries: Sequence[Symmetry] | None = None) -> list[ClaimError]:
    """Worst relative output change of every claim of a traced ``analysis`` (see the module docstring).

    ``inputs`` default to the example inputs the model was traced with (fresh inputs are drawn like
    them, ``draws`` times; the keyword example inputs are drawn afresh the same way and always passed);
    ``symmetries`` default to all the analysis claims. Parameters and buffers are the model's own, in float64
    on ``device``.
    """
    claims = list(analysis.symmetries if symmetries is None else symmetries)
    graph = analysis.model_graph
    inputs = graph.example_inputs if inputs is None else inputs
    if inputs is None:
        raise ValueError("claim_errors: the model was traced without example_inputs; pass inputs=(tensor, ...)")
    if graph.model is None:
        raise ValueError("claim_errors: the model graph carries no model to run")
    dtype = torch.float64
    model = graph.model
    if any((t.is_floating_point() and t.dtype != dtype) or t.device != torch.device(device)
           for t in (*model.parameters(), *model.buffers())):
        model = copy.deepcopy(model).to(device=device, dtype=dtype)   # the caller's model stays as it is
    parameters = {k for k, _ in model.named_parameters()}
    state = {**{k: v.detach() for k, v in model.named_parameters()},
             **{k: v.detach() for k, v in model.named_buffers()}}
    generator = torch.Generator().manual_seed(seed)
    cross_entropy = analysis.loss == "cross_entropy"
    tolerance = certification_tolerance(graph)
    worst = {id(s): ClaimError(s, 0.0, tolerance=tolerance) for s in claims}
    for draw in range(draws):
        # fresh elements per draw; equal groups share them (S(3072) of every layer: one pair)
        by_group: dict[SiteGroup, list[tuple[str, torch.Tensor]]] = {}
        for s in claims:
            if s.group not in by_group:
                by_group[s.group] = s.group.sample(generator, dtype, device)
        elements = {id(s): by_group[s.group] for s in claims}
        rounds = max((len(e) for e in elements.values()), default=0)
        x = fresh_inputs(inputs, generator, dtype, device)
        keywords = fresh_inputs(graph.example_kwargs, generator, dtype, device)
        reference = _forward(model, state, x, keywords, parameters, seed + draw, device)

        for r in range(rounds):
            chosen = [(s, elements[id(s)][r]) for s in claims if r < len(elements[id(s)])]

            def change(members: list[int]) -> tuple[float, str]:
                moved = compose(state, [(chosen[i][0], chosen[i][1][1]) for i in members])
                return output_change(_forward(model, moved, x, keywords, parameters, seed + draw, device), reference,
                                     cross_entropy)

            def record(members: list[int], error: float, output: str) -> None:
                others = f" composed with {len(members) - 1} other claims" if len(members) > 1 else ""
                for i in members:
                    symmetry, (element, _) = chosen[i]
                    if error > worst[id(symmetry)].error:
                        worst[id(symmetry)] = ClaimError(symmetry, error, element + others, output, tolerance)

            check_in_separating_sets(len(chosen), change, tolerance, record)
    return [worst[id(s)] for s in claims]


def assert_claims_hold(analysis: Certifiable, **options: Any) -> None:
    """Raise ``AssertionError`` listing every claim of ``analysis`` that changes an output
    (:func:`claim_errors` with ``options``); for tests of inference rules, on ``derive(..., certify=False)``."""
    failures = [str(e) for e in claim_errors(analysis, **options) if not e.holds]
    if failures:
        raise AssertionError("claims that change an output: " + "; ".join(failures))
