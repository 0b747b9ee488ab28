"""Numerical certification of claimed symmetries on the model itself.

A claim ``θ ↦ g·θ`` is about the architecture: ``F(g·θ, x) = F(θ, x)`` for every output of ``F``, every input ``x``
of every shape the model takes, every parameter point ``θ`` and every ``g`` of the group. :func:`certify` measures
the worst relative change of any output over

* **points** (:class:`Point`): the model's own parameters **and buffers** on fresh inputs shaped like the example
  inputs, then a *generic* point (:func:`generic_state`: noise on every parameter and persistent buffer, so that
  special values such as ``p = 1``, a zero-initialised head or a layer scale of ``10⁻⁶`` are left) on inputs of
  *other shapes* (:func:`shape_variants`: a batch of one and of ``B + 1``, sequence lengths and spatial sizes one
  less and one more; a shape the model refuses is recorded, not an error);
* test elements of each group, drawn anew at each point: ``exp(M)`` with ``‖M‖`` near ``1`` (and ``10⁻³`` at the
  first generic point), an element of another component (the first discrete generator times ``exp(M)``) and, for
  wide sign flips, random sign patterns, all drawn **for each claim on its own**; every discrete generator
  (:meth:`~symalg.catalogue.groups.SiteGroup.sample`), shared by the claims of one group;
* float64, with stochastic ops (dropout) drawing the same noise for ``θ`` and ``g·θ``.

With ``loss="cross_entropy"`` the first output is the logits and is compared after ``softmax`` (the
loss's own invariance); every other output is compared as it is.

**Composition.** The composition of symmetries is a symmetry, so one forward pass checks a set of claims composed.
Two false claims could hide each other in a set (one tie split in two, moved by the same element). The elements each
claim draws on its own cancel only for a null set of draws (``2⁻ʰ`` for sign patterns), so each such round is **one**
pass for all claims. The discrete generators are shared by the claims of a group, so at the first generic point they
are checked in sets that separate every two claims (:func:`separating_sets`: ``⌈log₂(n + 1)⌉`` passes for ``n``
claims); at the other points all in one pass. A failing set is halved until its failing claims stand alone
(:func:`check_in_separating_sets`). Within a pass the claims are composed kind by kind (:func:`_changes`).

**Sensitivity.** A check that passes because the outputs ignore the parameters proves nothing. At the model's and
at the generic parameters one backward pass each gives every tensor's sensitivity ``σ_t = rms(t) ‖∂s/∂t‖`` (``s`` a
random projection of the outputs, each normalised to its largest entry): about the relative change of the outputs
under a random relative perturbation of ``t`` of size one, a perturbation that is not in any group. A claim whose
tensors all have ``σ < SENSITIVITY_FACTOR · tolerance`` at both points is *not certifiable here*
(:attr:`ClaimError.certifiable`), and so not certified.

The verdict is one :class:`ClaimError` per claim: the worst error over every point and element, where it was
measured, and the claim's sensitivity; :class:`Certificate` adds the points checked and the shapes refused.

The model runs with its tensors bound in place (:class:`_Bound`: a pass re-binds only the tensors a set moves,
not every tensor as ``functional_call`` does).

>>> import torch, symalg
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
>>> analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),)), certify=False)
>>> [e.holds for e in claim_errors(analysis)]
[True, True]
>>> certificate = certify(analysis)
>>> certificate.points
("the model's parameters, inputs (5, 3)", 'generic parameters, inputs (1, 3)', 'generic parameters, inputs (6, 3)')
>>> certificate.notes[0][:75]
'input shapes the model refused (not checked): axis 1: 3 → 2 (RuntimeError: '
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence, overload

import torch

from symalg.catalogue.bindings import Binding, TranslationFamily
from symalg.catalogue.groups import SAMPLE_SCALES, Device, Mover, SiteGroup
from symalg.frontend.grammar import check_entries
from symalg.frontend.outputs import output_tensors
from symalg.ir.graph import ModelGraph
from symalg.numeric.linalg import relative_error

if TYPE_CHECKING:  # for the annotation only
    from symalg.symbolic.symmetry import Symmetry

__all__ = ["Certificate", "ClaimError", "CERTIFICATION_TOLERANCE", "GENERIC_NOISE", "Point", "SENSITIVITY_FACTOR",
           "certification_tolerance", "assert_claims_hold", "certify", "claim_errors", "check_in_separating_sets",
           "compose", "fresh_inputs", "generic_state", "output_change", "sample_elements", "separating_sets",
           "shape_variants"]

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
    """What :func:`certify` reads of an analysis (a :class:`~symalg.symbolic.derive.Analysis`; that module
    imports this one, so certification names the surface it uses)."""

    @property
    def symmetries(self) -> Sequence[Symmetry]: ...
    @property
    def model_graph(self) -> ModelGraph: ...
    @property
    def loss(self) -> str: ...


GENERIC_NOISE = 0.5
"""The generic point's noise, relative to each tensor's root mean square (:func:`generic_state`)."""

SENSITIVITY_FACTOR = 10.0
"""A claim is certifiable where a random perturbation of its tensors of their own size, which is not in the group,
changes the outputs by at least this many tolerances (:attr:`ClaimError.certifiable`)."""


@dataclass(frozen=True)
class ClaimError:
    """The worst relative output change one claim caused: ``error`` under ``element`` on ``output`` at ``point``;
    ``sensitivity`` is the largest :math:`σ_t` of its tensors (module docstring), ``inf`` where not measured."""

    symmetry: Symmetry
    error: float
    element: str = ""
    output: str = ""
    tolerance: float = CERTIFICATION_TOLERANCE
    """The model's :func:`certification_tolerance`."""
    point: str = ""
    sensitivity: float = float("inf")

    @property
    def certifiable(self) -> bool:
        """The outputs react to the claim's tensors: ``sensitivity ≥ SENSITIVITY_FACTOR · tolerance``."""
        return self.sensitivity >= SENSITIVITY_FACTOR * self.tolerance

    @property
    def holds(self) -> bool:
        """Certified: the claim kept every output within the tolerance, and the check could have seen it fail."""
        return self.error <= self.tolerance and self.certifiable

    @property
    def reason(self) -> str:
        """Why the claim is not certified ("" when it is)."""
        if not self.error <= self.tolerance:
            where = f" at {self.point}" if self.point else ""
            return (f"failed numerical certification: relative error {self.error:.1e} on output {self.output!r} "
                    f"under {self.element}{where}")
        if not self.certifiable:
            return (f"not certifiable here: a random perturbation of its tensors that is not in the group changes "
                    f"the outputs by about {self.sensitivity:.1e} (relative), under {SENSITIVITY_FACTOR:g} times the "
                    f"tolerance {self.tolerance:.0e}, so the check cannot tell it from a symmetry")
        return ""

    def __str__(self) -> str:
        if self.error <= self.tolerance and not self.certifiable:
            return f"{self.symmetry.label}: {self.reason}"
        where = f" at {self.point}" if self.point else ""
        return (f"{self.symmetry.label}: relative error {self.error:.2e} on output {self.output!r} under "
                f"{self.element}{where}")


@dataclass(frozen=True)
class Point:
    """One place the claims are checked at: parameters and buffers (``state``) and inputs."""

    label: str
    state: Mapping[str, torch.Tensor]
    inputs: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    separate: bool = False
    """Check the shared discrete elements in sets separating every two claims (else all composed in one pass)."""


@dataclass(frozen=True)
class Certificate:
    """The verdict of :func:`certify`: one :class:`ClaimError` per claim, the points checked
    (:attr:`Point.label`) and notes (input shapes the model refused, a generic point that could not be had)."""

    errors: tuple[ClaimError, ...]
    points: tuple[str, ...]
    notes: tuple[str, ...] = ()


def sample_elements(group: SiteGroup, generator: torch.Generator, dtype: torch.dtype = torch.float64,
                    device: Device = "cpu") -> list[tuple[str, torch.Tensor]]:
    """The test elements of ``group``: :meth:`~symalg.catalogue.groups.SiteGroup.sample` (every discrete generator,
    ``exp(M)`` near and far from the identity, another component; random sign patterns for wide sign flips).
    A group whose elements are dense ``h × h`` matrices is refused above the entry limit of the grammar."""
    _check_size(group)
    return group.sample(generator, dtype, device)


def _check_size(group: SiteGroup) -> None:
    if group.element_format == "matrix":
        width = int(group.width)
        check_entries(width ** 2, f"a group acting on a site of width {width} (its {width}×{width} matrices)")


@overload
def fresh_inputs(example_inputs: Mapping[str, Any], generator: torch.Generator, dtype: torch.dtype = ...,
                 device: Device = ..., shapes: Mapping[Any, tuple[int, ...]] | None = ...) -> dict[str, Any]: ...
@overload
def fresh_inputs(example_inputs: Sequence[Any], generator: torch.Generator, dtype: torch.dtype = ...,
                 device: Device = ..., shapes: Mapping[Any, tuple[int, ...]] | None = ...) -> tuple[Any, ...]: ...
def fresh_inputs(example_inputs: Sequence[Any] | Mapping[str, Any], generator: torch.Generator,
                 dtype: torch.dtype = torch.float64, device: Device = "cpu",
                 shapes: Mapping[Any, tuple[int, ...]] | None = None) -> tuple[Any, ...] | dict[str, Any]:
    """Inputs like ``example_inputs`` (a sequence of positional inputs, or a mapping of keyword inputs: the same
    kind comes back), drawn anew: floating tensors from ``N(0, s²)`` with ``s`` the example's standard deviation
    (1 when it has none); integer tensors (token ids) uniformly between the example's minimum and maximum; booleans
    (masks) and non-tensors (``use_cache=False``) kept as given. ``shapes`` (by position or keyword) draws those
    inputs at other shapes; a boolean mask drawn at another shape must be constant (it is filled with its value).

    >>> fresh_inputs({"ids": torch.tensor([3, 5]), "use_cache": False}, torch.Generator().manual_seed(0))["use_cache"]
    False
    >>> fresh_inputs((torch.zeros(4, 3),), torch.Generator(), shapes={0: (1, 3)})[0].shape
    torch.Size([1, 3])
    """
    shapes = shapes or {}
    if isinstance(example_inputs, Mapping):
        return {k: _fresh(x, generator, dtype, device, shapes.get(k)) for k, x in example_inputs.items()}
    return tuple(_fresh(x, generator, dtype, device, shapes.get(i)) for i, x in enumerate(example_inputs))


def _fresh(x: object, generator: torch.Generator, dtype: torch.dtype, device: Device,
           shape: tuple[int, ...] | None = None) -> object:
    """One input drawn anew like ``x`` (see :func:`fresh_inputs`), at ``shape`` when given."""
    if not isinstance(x, torch.Tensor):
        return x
    size = tuple(x.shape) if shape is None else shape
    if x.dtype == torch.bool or x.numel() == 0:
        if shape is None or size == tuple(x.shape):
            return x.to(device)
        if x.numel() == 0 or not bool((x == x.flatten()[0]).all()):
            raise ValueError(f"a boolean mask of shape {tuple(x.shape)} that is not constant cannot be drawn at "
                             f"shape {size}")
        return torch.full(size, bool(x.flatten()[0]), device=device)
    if torch.is_floating_point(x):
        scale = x.double().std().item() if x.numel() > 1 else 1.0
        scale = scale if scale > 0 and scale == scale else 1.0
        return (scale * torch.randn(size, generator=generator, dtype=torch.float64)).to(device, dtype)
    low, high = int(x.min()), int(x.max())
    return torch.randint(low, high + 1, size, generator=generator, dtype=x.dtype).to(device)


def shape_variants(example_inputs: Sequence[Any],
                   example_kwargs: Mapping[str, Any]) -> list[tuple[str, int, int, dict[Any, tuple[int, ...]]]]:
    """Other input shapes to certify at: ``[(label, axis, step, {input: shape}), ...]``, two per axis class.

    Axes of the tensor inputs are classed by ``(axis, size)`` (``input_ids`` and ``attention_mask`` of shape
    ``(2, 7)`` share the classes ``(0, 2)`` and ``(1, 7)``), and each class is changed on every input at once: axis 0
    (the batch) to 1 and to ``size + 1`` (``step`` −1 and +1; 2 and 3 from 1), any other axis to ``size − 1`` (from
    2 on) and ``size + 1``. A branch on a size next to the example's (``B > 1``, ``T >= 8``, ``B % 2``) is taken the
    other way by one of them. Feature axes are among them; the model refuses those, which :func:`certify` records.

    >>> [(label, shapes) for label, _, _, shapes in shape_variants((torch.zeros(8, 3),), {})]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('axis 0: 8 → 1', {0: (1, 3)}), ('axis 0: 8 → 9', {0: (9, 3)}), ('axis 1: 3 → 2', {0: (8, 2)}),
     ('axis 1: 3 → 4', {0: (8, 4)})]
    """
    tensors: dict[Any, tuple[int, ...]] = {i: tuple(x.shape) for i, x in enumerate(example_inputs)
                                           if isinstance(x, torch.Tensor)}
    tensors.update({k: tuple(x.shape) for k, x in example_kwargs.items() if isinstance(x, torch.Tensor)})
    classes = dict.fromkeys((axis, size) for shape in tensors.values() for axis, size in enumerate(shape))
    variants = []
    for axis, size in classes:
        if axis == 0:
            sizes = [(-1, 1), (1, size + 1)] if size > 1 else [(-1, 2), (1, 3)]
        else:
            sizes = ([(-1, size - 1)] if size > 1 else []) + [(1, size + 1)]
        for step, new in sizes:
            shapes = {key: tuple(new if a == axis and s == size else s for a, s in enumerate(shape))
                      for key, shape in tensors.items() if len(shape) > axis and shape[axis] == size}
            variants.append((f"axis {axis}: {size} → {new}", axis, step, shapes))
    return variants


def generic_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor], generator: torch.Generator,
                  noise: float = GENERIC_NOISE) -> dict[str, torch.Tensor]:
    """``state`` moved to a generic point by independent noise ``N(0, s²)`` on every floating parameter and
    persistent buffer: ``s = max(noise · rms(t), √(2 / fan_in))`` for a parameter of two axes or more (``fan_in``
    its entries per row: the He scale, so that the signal of a deep network neither dies nor explodes and every
    layer's tensors reach the outputs), ``s = noise · max(rms(t), ρ / 10)`` for the others (``ρ`` the median rms of
    the parameters of two axes or more, 1 where there are none). Equal entries (``p = 1``), zeros (a zero-initialised
    head) and tiny constants (a layer scale of ``10⁻⁶``) leave their special values; a tensor with positive entries
    only (a running variance, a gain) stays positive (``|t + ε|``). Non-persistent buffers are constants of the
    architecture (causal masks, rotary tables) and stay, as do integer and boolean tensors and tensors with
    non-finite entries.

    >>> layer = torch.nn.Linear(2, 2).double()
    >>> _ = torch.nn.init.zeros_(layer.weight)
    >>> bool(generic_state(layer, dict(layer.named_parameters()), torch.Generator())["weight"].abs().min() > 0)
    True
    """
    constants = {f"{prefix}.{name}" if prefix else name for prefix, module in model.named_modules()
                 for name in module._non_persistent_buffers_set}
    parameters = {name for name, _ in model.named_parameters()}
    rms = {name: _rms(t) for name, t in state.items()
           if name not in constants and t.is_floating_point() and t.numel() > 0}
    scales = sorted(r for name, r in rms.items() if name in parameters and state[name].dim() >= 2)
    reference = scales[len(scales) // 2] if scales and scales[len(scales) // 2] > 0 else 1.0
    moved = dict(state)
    for name, r in rms.items():
        t = state[name]
        if not r < float("inf"):   # non-finite entries (or a norm overflowing float64): the tensor stays
            continue
        if name in parameters and t.dim() >= 2:
            scale = max(noise * r, (2 * t.shape[0] / t.numel()) ** 0.5)
        else:
            scale = noise * max(r, reference / 10)
        eps = torch.randn(t.shape, generator=generator, dtype=torch.float64).to(t.device, t.dtype)
        moved[name] = torch.add(t, eps, alpha=scale)
        if bool(t.min() > 0):
            moved[name].abs_()
    return moved


def _rms(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach(), dtype=torch.float64)) / t.numel() ** 0.5 if t.numel() else 0.0


class _Bound:
    """A model (the certification's own copy) run at tensors bound into its modules in place: ``run(changes)``
    binds the changed tensors under every name they have (tied weights included), runs, and binds the previous
    ones back, so a pass costs the tensors it moves, not all of them (``functional_call`` re-binds every tensor).
    Buffers are bound as copies in training mode (running statistics update them in place), and stochastic ops are
    seeded so that every pass of one point draws the same noise: on the CPU its generator alone
    (``torch.manual_seed`` also seeds every accelerator's, through a lazy call that records a stack trace: 2 ms,
    more than the forward pass of a small model)."""

    def __init__(self, model: torch.nn.Module, device: Device) -> None:
        self.model, self.device = model, device
        self.places: dict[str, list[tuple[torch.nn.Module, str, bool]]] = {}
        owner: dict[int, str] = {}
        modules = dict(model.named_modules(remove_duplicate=False))
        named = [(n, t, True) for n, t in model.named_parameters(remove_duplicate=False)] + \
                [(n, t, False) for n, t in model.named_buffers(remove_duplicate=False)]
        for name, tensor, is_parameter in named:
            prefix, _, attribute = name.rpartition(".")
            canonical = owner.setdefault(id(tensor), name)
            module = modules[prefix] if prefix in modules else model.get_submodule(prefix)
            self.places.setdefault(canonical, []).append((module, attribute, is_parameter))
        self.buffers = [name for name, _ in model.named_buffers()]
        self.parameters = {name for name, _ in model.named_parameters()}
        self.training = any(m.training for m in model.modules())
        self.originals = {name: places[0][0]._parameters[places[0][1]] if places[0][2] else
                          places[0][0]._buffers[places[0][1]] for name, places in self.places.items()}
        self.current = {name: t for name, t in self.originals.items() if t is not None}

    def restore(self) -> None:
        """The model's own tensors (parameters as ``Parameter`` objects) back in its modules."""
        self.bind({name: t for name, t in self.originals.items() if t is not None})

    def bind(self, values: Mapping[str, torch.Tensor]) -> None:
        """Bind ``values`` (by the names of ``named_parameters``/``named_buffers``) for the passes to come."""
        for name, value in values.items():
            for module, attribute, is_parameter in self.places[name]:
                # a plain tensor where a Parameter was: modules read their tensors through these dicts
                (module._parameters if is_parameter else module._buffers)[attribute] = value  # type: ignore[assignment]
            self.current[name] = value

    def run(self, changes: Mapping[str, torch.Tensor], inputs: tuple[Any, ...], kwargs: Mapping[str, Any],
            seed: int, grad: bool = False) -> list[tuple[str, torch.Tensor]]:
        """Every output (:func:`~symalg.frontend.outputs.output_tensors`) with ``changes`` bound for this pass
        (with autograd recording only where ``grad``)."""
        if self.training:
            changes = {**{b: self.current[b].clone() for b in self.buffers}, **changes}
        previous = {name: self.current[name] for name in changes}
        self.bind(changes)
        try:
            with torch.random.fork_rng(devices=[]), torch.set_grad_enabled(grad):
                (torch.default_generator.manual_seed if torch.device(self.device).type == "cpu"
                 else torch.manual_seed)(seed)
                return output_tensors(self.model(*inputs, **kwargs))
        finally:
            self.bind(previous)


@dataclass(frozen=True)
class _Move:
    """One claim moved by one element, prepared once for all the passes that compose it (:func:`_changes`):
    ``factors`` where every region it moves is scaled by a diagonal (positive scalings), ``indices`` where it is
    permuted (permutations), ``mover`` where every region is multiplied by a matrix (``GL`` of a head: ``g⁻ᵀ``
    computed once, not at every pass), else none (the claim's own ``apply`` at each pass: translations, shifts)."""

    symmetry: Symmetry
    g: torch.Tensor
    factors: tuple[tuple[tuple, Binding, torch.Tensor], ...] | None = None
    indices: tuple[tuple[tuple, Binding, torch.Tensor], ...] | None = None
    """``(region, binding, factors or index)`` for each region moved."""
    mover: Mover | None = None

    @classmethod
    def scaled(cls, symmetry: Symmetry, signs: torch.Tensor) -> "_Move":
        """Sign flips given by their pattern ``signs`` (:meth:`~symalg.catalogue.groups.SiteGroup.random_diagonals`:
        every region, in and out, multiplied by it), without the dense ``diag(signs)`` of a wide layer."""
        return cls(symmetry, signs, factors=tuple((b.region, b, signs) for b in symmetry.moving_bindings()))

    @classmethod
    def of(cls, symmetry: Symmetry, g: torch.Tensor, memo: dict[tuple, Any] | None = None) -> "_Move":
        """``symmetry`` moved by ``g``; ``memo`` keeps, by group and element, what the claims moved by one element
        share (its mover, its permutation index): the discrete generators of a group, shared by its claims."""
        if symmetry.translations or symmetry.shifts:
            return cls(symmetry, g)
        group, memo = symmetry.group, {} if memo is None else memo
        if group.permutes_entries:
            index = _kept(memo, ("index", group, id(g)), (g,), lambda: g.argmax(-1))
            return cls(symmetry, g, indices=tuple((b.region, b, index) for b in symmetry.moving_bindings()))
        move = _kept(memo, ("mover", group, id(g)), (g,), lambda: group.mover(g, checked=False))
        factors = tuple((b.region, b, move.diagonal(b.role, b.power)) for b in symmetry.moving_bindings())
        if all(d is not None for *_, d in factors):
            return cls(symmetry, g, factors=factors)
        if all(d is None for *_, d in factors):
            return cls(symmetry, g, mover=move)
        return cls(symmetry, g)


def _kept(memo: dict[tuple, Any], key: tuple, alive: tuple, make: Callable[[], Any]) -> Any:
    """``memo[key]``, made by ``make`` the first time; ``key`` names objects by ``id``, which is unique only while they
    live, so the entry keeps them (``alive``) and is made anew where they are not the same objects."""
    known = memo.get(key)
    if known is None or any(a is not b for a, b in zip(known[0], alive)):
        known = memo[key] = (alive, make())
    return known[1]


class _Drawn:
    """Elements of one scaling group drawn at once for all its claims (a row each: ``exp(M)`` of
    :meth:`~symalg.catalogue.groups.SiteGroup.random_algebra_elements`), with the diagonal operators of every row
    computed at once by role and power: a claim's move is then its rows, not a mover and its operators."""

    def __init__(self, group: SiteGroup, elements: torch.Tensor) -> None:
        self.group, self.elements, self.taken = group, elements, 0
        self.operators: list[tuple[str, Any, torch.Tensor]] = []   # a few (role, power) pairs; a Fraction hashes slowly

    @staticmethod
    def batches(group: SiteGroup) -> bool:
        """The group's elements and operators are vectors (entrywise: a row each) and it acts by multiplying."""
        return group.is_continuous and group.element_format == "diagonal" and type(group).act is SiteGroup.act

    def operator(self, role: str, power: Any) -> torch.Tensor:
        for known_role, known_power, rows in self.operators:
            if known_role == role and (known_power is power or known_power == power):
                return rows
        rows = self.group.operator(self.elements, role, power)
        self.operators.append((role, power, rows))
        return rows

    def move(self, symmetry: Symmetry) -> _Move:
        """The next row's element moving ``symmetry``."""
        row, self.taken = self.taken, self.taken + 1
        return _Move(symmetry, self.elements[row], factors=tuple((b.region, b, self.operator(b.role, b.power)[row])
                                                                 for b in symmetry.moving_bindings()))


SMALL = 1 << 16
"""Tensors of up to this many entries are moved in batches (:func:`_whole_axes`): one operation for all the tensors
of a shape, where one per tensor would cost more in Python than in arithmetic (a deep chain of narrow layers)."""


_Regions = dict[tuple, tuple[Binding, torch.Tensor]]
"""``{region: (binding, factors or index)}``: the composed moves of one kind (:func:`_changes`)."""


def _whole_axes(state: Mapping[str, torch.Tensor], moved: dict[str, torch.Tensor], regions: _Regions,
                gather: bool) -> _Regions:
    """Move the small tensors (:data:`SMALL`) whose ``regions`` are whole axes, in batches: the tensors of one shape
    moved along the same axes are stacked, and each axis is multiplied by its factors, or gathered by its index
    (``gather``), at once for all of them (``moved`` gets their views of the stack). Returns the regions left (slices,
    blocks, large tensors), to be moved one by one.

    >>> W = torch.ones(2, 3, dtype=torch.float64)
    >>> moved = {}
    >>> left = _whole_axes({"w": W}, moved, {("w", 1, 0, 3, 1): (Binding("w", axis=1, start=0, width=3),
    ...                                                           torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))},
    ...                    gather=False)
    >>> left, moved["w"].tolist()
    ({}, [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    """
    left: _Regions = {}
    axes: dict[str, dict[int, torch.Tensor]] = {}
    for region, (b, vector) in regions.items():
        source = moved[b.tensor] if b.tensor in moved else state[b.tensor]
        if b.block == 1 and source.numel() <= SMALL and b.is_whole(source):
            axes.setdefault(b.tensor, {})[b.axis] = vector
        else:
            left[region] = (b, vector)
    batches: dict[tuple, list[str]] = {}
    for t, by_axis in axes.items():
        source = moved[t] if t in moved else state[t]
        batches.setdefault((tuple(source.shape), source.dtype, source.device, tuple(sorted(by_axis))), []).append(t)
    for (shape, *_, moving), names in batches.items():
        stacked = torch.stack([moved[t] if t in moved else state[t] for t in names])
        for axis in moving:
            view = [len(names)] + [1] * len(shape)
            view[axis + 1] = shape[axis]
            vectors = torch.stack([axes[t][axis] for t in names]).view(view)
            stacked = stacked.gather(axis + 1, vectors.expand_as(stacked)) if gather else stacked.mul_(vectors)
        moved.update(zip(names, stacked.unbind()))
    return left


@torch.no_grad()   # the moved tensors are new values, not functions of the model's parameters
def _changes(state: Mapping[str, torch.Tensor], moves: Sequence[_Move]) -> dict[str, torch.Tensor]:
    """The tensors of ``state`` that ``moves`` move, moved (see :func:`compose`).

    A composition of symmetries in any order is a symmetry, so the claims are composed kind by kind, each region moved
    once per kind: first those that only scale their regions, their factors multiplied region by region; then the
    permutations, their indices composed region by region in turn (``U[i₁][i₂] = U[i₁[i₂]]``); then the others in
    turn, each seeing the tensors it touches. Small tensors moved along whole axes are moved in batches
    (:func:`_whole_axes`); elsewhere a tensor's first move computes it anew out of place (no copy of it first), and the
    later ones move that result in place."""
    moved: dict[str, torch.Tensor] = {}
    factors: _Regions = {}
    indices: _Regions = {}
    for m in moves:
        for region, b, diagonal in m.factors or ():
            first, product = factors.get(region, (b, None))
            factors[region] = (first, diagonal if product is None else product * diagonal)
        for region, b, index in m.indices or ():
            first, composed = indices.get(region, (b, None))
            indices[region] = (first, index if composed is None else composed[index])
    for binding, diagonal in _whole_axes(state, moved, factors, gather=False).values():
        t = binding.tensor
        moved[t] = binding.scale(moved[t] if t in moved else state[t], diagonal, inplace=t in moved)
    for binding, index in _whole_axes(state, moved, indices, gather=True).values():
        t = binding.tensor
        source = moved[t] if t in moved else state[t]
        if binding.block == 1 and binding.is_whole(source):   # the whole axis permuted: one gather, a new tensor
            moved[t] = source.index_select(binding.axis, index)
        else:
            moved[t] = binding.fold(source, binding.unfold(source)[index], inplace=t in moved)
    for m in moves:
        if m.mover is not None:
            for b in m.symmetry.moving_bindings():
                moved[b.tensor] = moved[b.tensor] if b.tensor in moved else state[b.tensor].clone()
                b.fold(moved[b.tensor], m.mover(b.unfold(moved[b.tensor]), b.role, b.power), inplace=True)
        elif m.factors is None and m.indices is None:
            symmetry = m.symmetry
            moved.update({t: state[t].clone() for t in symmetry.tensors if t not in moved})
            read = (*symmetry.reads, *(absorber.weight for absorber, _ in symmetry.shifts))   # weights a move reads
            touched = {t: moved[t] if t in moved else state[t] for t in (*symmetry.tensors, *read)}
            moved.update({t: v for t, v in symmetry.apply(touched, m.g, inplace=True, checked=False).items()
                          if t in symmetry.tensors})
    return moved


def compose(state: Mapping[str, torch.Tensor],
            claims: Sequence[tuple[Symmetry, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``state`` moved by every ``(symmetry, g)`` of ``claims`` in turn, for elements ``g`` the groups drew themselves
    (:func:`sample_elements`: not checked again). Each tensor a claim moves is computed anew once and then moved in
    place, and each claim sees only the tensors it touches, so composing ``n`` claims costs their moves, not ``n``
    copies of ``state`` (a model with thousands of tensors and of claims); the other tensors are shared with
    ``state``.

    >>> import torch, symalg
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1)).double()
    >>> scaling = symalg.derive(symalg.trace(model, (torch.randn(4, 2, dtype=torch.float64),))).symmetries[0]
    >>> state = dict(model.named_parameters())
    >>> moved = compose(state, [(scaling, torch.full((3,), 2.0, dtype=torch.float64))])
    >>> torch.equal(moved["0.bias"], 2 * state["0.bias"]), moved["2.bias"] is state["2.bias"]
    (True, True)
    """
    return {**state, **_changes(state, [_Move.of(symmetry, g) for symmetry, g in claims])}


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


def separating_sets(count: int) -> list[list[int]]:
    """Sets of the positions ``0 … count − 1`` such that every position lies in some set and any two positions lie
    apart in some set: for each binary digit of ``position + 1``, the positions where it is one
    (``⌈log₂(count + 1)⌉`` sets), or the positions one by one where that is no more sets.

    >>> separating_sets(3)
    [[0, 2], [1, 2]]
    >>> [len(s) for s in separating_sets(20)], all(any((i in s) != (j in s) for s in separating_sets(20))
    ...                                            for i in range(20) for j in range(i))
    ([10, 10, 9, 8, 5], True)
    """
    digits = count.bit_length()
    if count <= digits:
        return [[i] for i in range(count)]
    return [[i for i in range(count) if (i + 1) >> digit & 1] for digit in range(digits)]


def check_in_separating_sets(count: int, change: Callable[[list[int]], tuple[float, str]], tolerance: float,
                             record: Callable[[list[int], float, str], None],
                             sets: Sequence[list[int]] | None = None) -> set[int]:
    """Check ``count`` claims composed in ``sets`` (default :func:`separating_sets`); return the positions of those
    that fail alone.

    ``change(members)`` is the error (and where it was measured) with the claims at ``members`` composed. A set within
    ``tolerance`` holds for every member; a failing set is halved until its failing claims stand alone, and a claim
    that failed alone leaves the later sets. ``record(members, error, where)`` is called for every set that passed
    and for every claim that failed alone (``members`` of one). With the default sets any two claims lie apart in
    some set, so two false claims whose composition holds cannot pass together.
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

    for members in separating_sets(count) if sets is None else sets:
        settle(list(members))
    return failed


def certify(analysis: Certifiable, inputs: tuple[Any, ...] | None = None, draws: int = 2, seed: int = 0,
            device: Device = "cpu", symmetries: Sequence[Symmetry] | None = None) -> Certificate:
    """Check every claim of a traced ``analysis`` at several points (see the module docstring).

    ``inputs`` default to the example inputs the model was traced with; the keyword example inputs are always
    passed, drawn afresh like them. The points are the model's own parameters on inputs shaped like those, then
    (``draws ≥ 2``) the generic point on each accepted other shape (:func:`shape_variants`: the batch axis alone,
    then the other axes the model accepts, together), and the generic point on the example's shapes until there are
    ``draws`` points. ``symmetries`` default to all the analysis claims. Parameters and buffers are the model's own,
    in float64 on ``device``; the caller's model is never changed.
    """
    claims = list(analysis.symmetries if symmetries is None else symmetries)
    graph = analysis.model_graph
    inputs = graph.example_inputs if inputs is None else inputs
    if inputs is None:
        raise ValueError("certify: the model was traced without example_inputs; pass inputs=(tensor, ...)")
    if graph.model is None:
        raise ValueError("certify: the model graph carries no model to run")
    for s in claims:
        _check_size(s.group)
    dtype = torch.float64
    model = graph.model
    if any((t.is_floating_point() and t.dtype != dtype) or t.device != torch.device(device)
           for t in (*model.parameters(), *model.buffers())):
        model = copy.deepcopy(model).to(device=device, dtype=dtype)   # the caller's model stays as it is
    bound = _Bound(model, device)
    try:
        return _certify(bound, claims, inputs, graph.example_kwargs, draws, seed, device,
                        analysis.loss == "cross_entropy", certification_tolerance(graph))
    finally:
        bound.restore()   # the model's own tensors back in its modules


RETRIES = 2
"""Further generic points drawn for the claims the outputs cannot see at the first ones (a ReLU layer dead for every
input drawn, as a unit of width one often is at random parameters): each is checked and measured there too."""


def _certify(bound: _Bound, claims: Sequence[Symmetry], inputs: tuple[Any, ...], kwargs: Mapping[str, Any],
             draws: int, seed: int, device: Device, cross_entropy: bool, tolerance: float) -> Certificate:
    """:func:`certify` on a model bound in place."""
    dtype = torch.float64
    state = {name: t.detach() for name, t in bound.originals.items() if t is not None}
    generator = torch.Generator().manual_seed(seed)
    points, first_notes = _points(bound, state, inputs, kwargs, draws, generator, seed, dtype, device)
    notes = list(first_notes)
    worst = {i: ClaimError(s, 0.0, tolerance=tolerance) for i, s in enumerate(claims)}
    failed: set[int] = set()
    known: dict[tuple, Any] = {}   # what the points share (:func:`_rounds`)

    def check(point: Point, number: int, exclude: set[int]) -> None:
        """Every claim not in ``exclude`` at ``point`` (the failing ones join ``failed``)."""
        bound.bind(point.state)
        reference = bound.run({}, point.inputs, point.kwargs, seed + number)
        scales = SAMPLE_SCALES if point.separate else SAMPLE_SCALES[-1:]   # near the identity: once, with the pairs
        for elements, separate in _rounds(claims, generator, dtype, device, exclude, scales, known):
            def change(members: list[int]) -> tuple[float, str]:
                moved = _changes(point.state, [elements[i][2] for i in members])
                return output_change(bound.run(moved, point.inputs, point.kwargs, seed + number), reference,
                                     cross_entropy)

            def record(members: list[int], error: float, output: str) -> None:
                others = f" composed with {len(members) - 1} other claims" if len(members) > 1 else ""
                for i in members:
                    index, label, _ = elements[i]
                    if error > worst[index].error or (error == worst[index].error == 0.0 and not worst[index].point):
                        worst[index] = replace(worst[index], error=error, element=label + others, output=output,
                                               point=point.label)

            alone = check_in_separating_sets(len(elements), change, tolerance, record,
                                             None if separate and point.separate else [list(range(len(elements)))])
            failed.update(elements[i][0] for i in alone)

    def measure(at: Mapping[str, torch.Tensor], which: list[int]) -> None:
        """The sensitivities of the claims ``which`` at ``at``, on inputs of the example's shapes; each claim keeps
        its largest (it held wherever it was checked, so the outputs reacting at one point make the check there
        meaningful)."""
        bound.bind(at)
        measured, why = _sensitivities(bound, replace(points[0], state=at), [claims[i] for i in which],
                                       cross_entropy, generator, seed)
        for i, sigma in zip(which, measured):
            sensitivity[i] = max(sensitivity[i], sigma)
        notes.extend([why] if why and why not in notes else [])

    for number, point in enumerate(points):
        check(point, number, failed)
    sensitivity = [0.0] * len(claims)
    for at in {id(p.state): p.state for p in (points[0], points[-1])}.values():
        measure(at, list(range(len(claims))))
    for _ in range(RETRIES if draws > 1 else 0):
        blind = [i for i in range(len(claims)) if i not in failed and sensitivity[i] < SENSITIVITY_FACTOR * tolerance]
        found = _generic_point(bound, state, points[0], generator, seed) if blind else None
        if found is None:
            break
        points.append(Point(points[0].label.replace("the model's parameters", "generic parameters (another draw)"),
                            found, points[0].inputs, points[0].kwargs, separate=True))
        check(points[-1], len(points) - 1, set(range(len(claims))) - set(blind) | failed)
        measure(found, [i for i in blind if i not in failed])
    errors = tuple(replace(worst[i], sensitivity=sensitivity[i]) for i in range(len(claims)))
    return Certificate(errors, tuple(p.label for p in points), tuple(notes))


def claim_errors(analysis: Certifiable, inputs: tuple[Any, ...] | None = None, draws: int = 2, seed: int = 0,
                 device: Device = "cpu", symmetries: Sequence[Symmetry] | None = None) -> list[ClaimError]:
    """The :class:`ClaimError` of every claim of a traced ``analysis``: :func:`certify`'s errors."""
    return list(certify(analysis, inputs, draws, seed, device, symmetries).errors)


def _shapes_label(inputs: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    shapes = [tuple(x.shape) for x in (*inputs, *kwargs.values()) if isinstance(x, torch.Tensor)]
    return ", ".join(str(s) if len(s) != 1 else f"({s[0]},)" for s in shapes) or "no tensor inputs"


def _points(bound: _Bound, state: Mapping[str, torch.Tensor], inputs: tuple[Any, ...], kwargs: Mapping[str, Any],
            draws: int, generator: torch.Generator, seed: int, dtype: torch.dtype,
            device: Device) -> tuple[list[Point], tuple[str, ...]]:
    """The points of :func:`certify` and its notes (the shapes refused; no generic point with finite outputs).

    The model's own parameters on the example's shapes; then, with ``draws ≥ 2``, the generic point on the accepted
    shape variants one way together (a batch of one, every other axis the model accepts at ``size − 1``), where pairs
    of claims are separated (:attr:`Point.separate`), and the other way together (``B + 1``, ``size + 1``); each
    variant alone where the model refuses them together; then the generic point on the example's shapes until there
    are ``draws`` points."""
    def point(label: str, at: Mapping[str, torch.Tensor], shapes: Mapping[Any, tuple[int, ...]] | None,
              separate: bool = False) -> Point:
        x = fresh_inputs(inputs, generator, dtype, device, shapes)
        k = fresh_inputs(kwargs, generator, dtype, device, shapes)
        return Point(f"{label}, inputs {_shapes_label(x, k)}", at, x, k, separate)

    if draws < 2:
        return [point("the model's parameters", state, None, separate=True)], ()
    points = [point("the model's parameters", state, None)]
    notes: list[str] = []
    found = _generic_point(bound, state, points[0], generator, seed)
    if found is None:
        notes.append("no generic parameter point with finite outputs was found: the claims are checked at the "
                     "model's parameters only")
    generic = state if found is None else found
    accepted: list[tuple[int, int, dict[Any, tuple[int, ...]]]] = []
    refused: list[str] = []
    for label, axis, step, shapes in shape_variants(inputs, kwargs):
        problem = _refusal(bound, generic, inputs, kwargs, shapes, generator, seed, dtype, device)
        (refused.append(f"{label} ({problem})") if problem else accepted.append((axis, step, shapes)))
    if refused:
        notes.append("input shapes the model refused (not checked): " + "; ".join(refused))
    variants: list[dict[Any, tuple[int, ...]]] = []
    for direction in (-1, 1):   # every accepted change one way together (each alone where the model refuses that)
        changes = [shapes for _, step, shapes in accepted if step == direction]
        together = _combined(inputs, kwargs, changes)
        if len(changes) > 1 and _refusal(bound, generic, inputs, kwargs, together, generator, seed, dtype, device):
            variants += changes
        elif changes:
            variants.append(together)
    for number, shapes in enumerate(variants):
        points.append(point("generic parameters", generic, shapes, separate=number == 0))
    while len(points) < draws:
        points.append(point("generic parameters", generic, None, separate=len(points) == 1))
    if not variants:
        notes.append("no other input shape was accepted: the claims are checked at the example's shapes only")
    return points, tuple(notes)


def _combined(inputs: tuple[Any, ...], kwargs: Mapping[str, Any],
              variants: Sequence[Mapping[Any, tuple[int, ...]]]) -> dict[Any, tuple[int, ...]]:
    """The shapes with every axis that one of ``variants`` changes changed."""
    example: dict[Any, Any] = {**dict(enumerate(inputs)), **kwargs}
    together: dict[Any, list[int]] = {}
    for variant in variants:
        for key, shape in variant.items():
            new = together.setdefault(key, list(example[key].shape))
            for axis, (old, size) in enumerate(zip(example[key].shape, shape)):
                if old != size:
                    new[axis] = size
    return {key: tuple(shape) for key, shape in together.items()}


def _refusal(bound: _Bound, at: Mapping[str, torch.Tensor], inputs: tuple[Any, ...], kwargs: Mapping[str, Any],
             shapes: Mapping[Any, tuple[int, ...]], generator: torch.Generator, seed: int, dtype: torch.dtype,
             device: Device) -> str:
    """Why the model refuses inputs at ``shapes`` ("" when it runs them with finite outputs)."""
    try:
        x = fresh_inputs(inputs, generator, dtype, device, shapes)
        k = fresh_inputs(kwargs, generator, dtype, device, shapes)
        bound.bind(at)
        outputs = bound.run({}, x, k, seed)
    except Exception as error:  # the model's own refusal of the shape, whatever it raises
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    if not all(bool(y.isfinite().all()) for _, y in outputs if y.is_floating_point()):
        return "non-finite outputs"
    return ""


def _generic_point(bound: _Bound, state: Mapping[str, torch.Tensor], reference: Point, generator: torch.Generator,
                   seed: int) -> dict[str, torch.Tensor] | None:
    """:func:`generic_state` at the noise :data:`GENERIC_NOISE`, or ten and a hundred times less where the outputs
    are not finite there (a parameter under a square root); None where none is finite."""
    for noise in (GENERIC_NOISE, GENERIC_NOISE / 10, GENERIC_NOISE / 100):
        generic = generic_state(bound.model, state, generator, noise)
        bound.bind(generic)
        try:
            outputs = bound.run({}, reference.inputs, reference.kwargs, seed)
        except Exception:  # a parameter point the model refuses: try nearer the model's own
            continue
        if all(bool(y.isfinite().all()) for _, y in outputs if y.is_floating_point()):
            return generic
    return None


def _rounds(claims: Sequence[Symmetry], generator: torch.Generator, dtype: torch.dtype, device: Device,
            exclude: set[int], scales: Sequence[float],
            known: dict[tuple, Any] | None = None) -> list[tuple[list[tuple[int, str, _Move]], bool]]:
    """The rounds of one point: ``([(claim, label, move), ...], separate)``; ``known`` keeps what does not depend on
    the draws for the next points (the discrete generators of each group, their movers and permutation indices).

    Each claim draws its own random elements: ``exp(M)`` at each of ``scales``, the other component (a discrete
    generator times ``exp(M)``) and, for wide sign flips, :data:`~symalg.catalogue.groups.SIGN_FLIP_SAMPLES` random
    sign patterns: two false claims cancel only on a null (or ``2⁻ʰ``) set of draws, so each such round is composed
    in one pass (``separate`` False). The discrete generators (a transposition and a cycle, single flips, a
    reflection) are the same for every claim of a group: one round each, ``separate`` True
    (:func:`separating_sets`)."""
    own: list[list[tuple[int, str, _Move]]] = []
    shared: dict[SiteGroup, list[tuple[str, torch.Tensor]]] = {}
    common: list[list[tuple[int, str, _Move]]] = []
    memo: dict[tuple, Any] = {} if known is None else known

    def add(rounds: list[list[tuple[int, str, _Move]]], r: int, entry: tuple[int, str, _Move]) -> None:
        while len(rounds) <= r:
            rounds.append([])
        rounds[r].append(entry)

    batched = Counter(s.group for i, s in enumerate(claims) if i not in exclude and _Drawn.batches(s.group))
    drawn = {(group, scale): _Drawn(group, group.exp(group.random_algebra_elements(count, scale, generator, dtype,
                                                                                   device)))
             for group, count in batched.items() for scale in scales}
    for i, s in enumerate(claims):
        if i in exclude:
            continue
        group, r = s.group, 0
        if group.is_continuous:
            for scale in scales:
                move = drawn[group, scale].move(s) if group in batched else \
                    _Move.of(s, group.exp(group.random_algebra_element(scale, generator, dtype, device)))
                add(own, r, (i, f"exp(M), |M| = {scale:g}", move))
                r += 1
        patterns = None if s.shifts else group.random_diagonals(generator, dtype, device)
        if patterns is not None:
            for k, signs in enumerate(patterns):
                add(own, r, (i, f"random sign pattern {k}", _Move.scaled(s, signs)))
                r += 1
            continue
        if group not in shared and type(group).sample is SiteGroup.sample:   # no draw: the same at every point
            generators = memo.get(("generators", group)) or \
                memo.setdefault(("generators", group), [(f"discrete generator {k}", g) for k, g in
                                                        enumerate(group.discrete_generators(dtype, device))])
            shared[group] = generators
        elif group not in shared:   # random sign patterns
            shared[group] = [(label, g) for label, g in group.sample(generator, dtype, device, SAMPLE_SCALES[-1:])
                             if label.startswith(("discrete generator", "random sign pattern"))
                             and "times" not in label]
        if group.is_continuous and shared[group]:   # another component: the first generator times exp(M)
            far = group.exp(group.random_algebra_element(SAMPLE_SCALES[-1], generator, dtype, device))
            add(own, r, (i, f"discrete generator 0 times exp(M), |M| = {SAMPLE_SCALES[-1]:g}",
                         _Move.of(s, group.compose(shared[group][0][1], far))))
        for k, (label, g) in enumerate(shared[group]):   # the same move at every point
            add(common, k, (i, label, _kept(memo, ("move", id(s), id(g)), (s, g), lambda: _Move.of(s, g, memo))))
    return [(r, False) for r in own] + [(r, True) for r in common]


def _sensitivities(bound: _Bound, point: Point, claims: Sequence[Symmetry], cross_entropy: bool,
                   generator: torch.Generator, seed: int) -> tuple[list[float], str]:
    """Each claim's sensitivity at ``point`` and a note: the largest ``σ_t`` of its tensors (module docstring), ``inf``
    where every perturbation of the entries it moves lies in its group (:func:`_frees_its_entries`).

    ``σ_t = rms(t) ‖∂s/∂t‖`` for ``s = Σ_k ⟨r_k, y_k⟩ / (√n_k max|y_k|)`` over the floating outputs ``y_k`` (``n_k``
    entries, random ``r_k ~ N(0, 1)``) is about the relative output change under ``t ↦ t + rms(t) ξ`` with
    ``ξ ~ N(0, 1)``: one backward pass for every parameter. A claim none of whose tensors autograd reaches (buffers
    alone, as running statistics in training mode; parameters read through ``detach``), or every claim where the
    backward pass fails, is measured by that perturbation itself, one forward pass each."""
    parameters = {t for s in claims for t in s.tensors if isinstance(bound.current.get(t), torch.Tensor)
                  and t in bound.parameters and point.state[t].is_floating_point()}
    leaves = {t: point.state[t].detach().requires_grad_(True) for t in sorted(parameters)}   # new leaves, no copy
    note = ""
    try:
        with torch.enable_grad():
            outputs = bound.run(leaves, point.inputs, point.kwargs, seed, grad=True)
            total = torch.zeros((), dtype=torch.float64, device=bound.device)
            for index, (_, y) in enumerate(outputs):
                if not y.is_floating_point() or not y.requires_grad:
                    continue
                y = y.softmax(-1) if cross_entropy and index == 0 else y
                y = torch.where(y.isfinite(), y, torch.zeros_like(y))
                scale = y.detach().abs().max().clamp_min(torch.finfo(y.dtype).tiny) * y.numel() ** 0.5
                r = torch.randn(y.shape, generator=generator, dtype=torch.float64).to(y.device, y.dtype)
                total = total + (r * y).sum() / scale
            grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True) if total.requires_grad \
                else (None,) * len(leaves)
        # a tensor autograd does not reach (read through detach, no_grad, an integer cast) is measured by perturbation
        sigma = {t: _rms(leaf) * float(g.double().norm()) for (t, leaf), g in zip(leaves.items(), grads)
                 if g is not None}
    except Exception as error:  # an op without a derivative: each claim measured by a perturbation instead
        note = f"sensitivity measured by perturbation ({type(error).__name__}: {str(error).splitlines()[0]})"
        sigma = {}
    reference: list[tuple[str, torch.Tensor]] = []
    result = []
    for s in claims:
        if _frees_its_entries(s, point.state):
            result.append(float("inf"))
        elif any(t in sigma for t in s.tensors):
            result.append(max(sigma.get(t, 0.0) for t in s.tensors))
        else:
            reference = reference or bound.run({}, point.inputs, point.kwargs, seed)
            result.append(_perturbed_change(bound, point, s.tensors, reference, cross_entropy, generator, seed))
    return result, note


def _frees_its_entries(symmetry: Symmetry, state: Mapping[str, torch.Tensor]) -> bool:
    """Every change of the entries ``symmetry`` moves is in its group: translations of single regions, not sheared,
    each either entry by entry (a bias, or a head's part of it, that the outputs ignore) or of a region of one entry
    (a one-channel group's bias under group norm, a one-row weight). No perturbation of those entries lies outside the
    group, so the sensitivity control has nothing to measure: the check itself measures that the outputs ignore them.
    """
    def frees(family: TranslationFamily) -> bool:
        if family.absorbers or len(family.regions) != 1:
            return False
        if family.pattern == "entries":
            return True
        if family.pattern == "ones":
            return sum(int(d.count_nonzero()) for d in family.directions(state)[0].values()) == 1
        return family.regions[0].width * family.regions[0].block == 1   # "rows": one row

    return bool(symmetry.translations) and not symmetry.shifts and all(frees(f) for f in symmetry.translations)


PERTURBATION = 1e-4
"""The relative size of the perturbation that measures a sensitivity without autograd (:func:`_perturbed_change`)."""


def _perturbed_change(bound: _Bound, point: Point, tensors: Sequence[str], reference: list[tuple[str, torch.Tensor]],
                      cross_entropy: bool, generator: torch.Generator, seed: int) -> float:
    """The relative output change under ``t ↦ t + ε rms(t) ξ`` of ``tensors`` (``ε =`` :data:`PERTURBATION`), over
    ``ε``: the sensitivity of :func:`_sensitivities` measured by one forward pass."""
    moved = {t: point.state[t] + PERTURBATION * _rms(point.state[t]) *
             torch.randn(point.state[t].shape, generator=generator, dtype=torch.float64).to(point.state[t])
             for t in tensors if point.state[t].is_floating_point()}
    error, _ = output_change(bound.run(moved, point.inputs, point.kwargs, seed), reference, cross_entropy)
    return error / PERTURBATION


def assert_claims_hold(analysis: Certifiable, **options: Any) -> None:
    """Raise ``AssertionError`` listing every claim of ``analysis`` that changes an output or cannot be certified
    (:func:`claim_errors` with ``options``); for tests of inference rules, on ``derive(..., certify=False)``."""
    failures = [str(e) for e in claim_errors(analysis, **options) if not e.holds]
    if failures:
        raise AssertionError("claims that change an output: " + "; ".join(failures))
