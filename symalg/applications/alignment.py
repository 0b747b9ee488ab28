"""Aligning two trained networks by their *derived* symmetry groups, and the loss barrier of linear interpolation.

Two networks ``θ_A``, ``θ_B`` of one architecture compute the same functions along the orbit ``G·θ_B``. Before
interpolating ``θ(α) = (1−α)θ_A + αθ_B`` one may replace ``θ_B`` by ``g·θ_B`` for any ``g ∈ G``: the end point's
function is unchanged, the path is not. Git re-basin ([Ainsworth2023]) takes ``G`` to be the neuron permutations;
here ``G`` is whatever :func:`symalg.derive` certified for the model, one :class:`~symalg.symbolic.symmetry.Symmetry`
(group on a site class) at a time, chosen by its group's ``kind``:

* ``"S"`` (permutations ``P``; head permutations too): every region moves by ``P`` (rows of the unfolded region).
* ``"PS"`` (positive scalings ``d ∈ R_{>0}^h``): a region of power ``p`` and role ``out`` moves by ``d^p``, role
  ``in`` by ``d^{−p}`` (ReLU: rows of ``W_in``, ``b_in`` by ``d``, columns of ``W_out`` by ``1/d``).
* ``"O"`` (orthogonal maps): every region moves by ``g`` (``g^{−T} = g``).
* ``"GL"`` (invertible maps: a linear site, a residual stream without norm, attention's query/key and value/output
  maps per head): ``out`` regions move by ``g``, ``in`` regions by ``g^{−T}``.

Other kinds (sign flips, translations, shears, complex scalings) are left at the identity.

**Weight matching** minimises ``J(g) = Σ_regions ‖U_A − op(g) U_B‖²``, the part of ``‖θ_A − g·θ_B‖²`` that ``g``
moves, for one symmetry at a time, sweeping over the symmetries (block coordinate descent):

* ``S``: ``J = const − 2 tr(Pᵀ C)``, ``C = Σ U_A U_Bᵀ``: a linear assignment (``scipy.optimize.linear_sum_assignment``).
* ``PS``: separable per unit, ``J_i(d) = Σ_b ‖a_b − d^{e_b} b_b‖²`` with ``e_b = ±p``: minimised over ``log d`` on a
  grid containing ``0`` (so never worse than the identity), refined by golden section.
* ``O``: ``J = const − 2 tr(gᵀ C)``: orthogonal Procrustes, ``g = U Vᵀ`` for ``C = U Σ Vᵀ``.
* ``GL``: no closed form with both ``g`` and ``g^{−T}``; L-BFGS from the Procrustes solution (or ``I``), kept only if
  ``J`` is lower than at ``I``.

Every step lowers or keeps ``J`` and moves nothing else, so ``‖θ_A − θ_B'‖`` never increases over the sweeps.

**Activation matching** fits ``g`` to the site values instead: ``Z_A, Z_B ∈ R^{N×h}`` read from the module named by
the symmetry's site (the layer writing the site; its output moves by ``z ↦ g z``): ``S``: assignment on
``Z_Aᵀ Z_B``; ``PS``: ``d_i = ‖a_i‖/‖b_i‖``, equal magnitudes (the least-squares ``⟨a_i, b_i⟩/‖b_i‖²`` goes to 0 for a
poorly matched unit and multiplies its readers by ``1/d_i``); ``O``: Procrustes on ``Z_Bᵀ Z_A``;
``GL``: least squares ``g = argmin ‖Z_A − Z_B gᵀ‖`` (needs rank ``Z_B = h``). A symmetry whose site is no module
(a head's query/key map, head permutations), or whose values are rank deficient, falls back to weight matching,
and :attr:`Alignment.methods` says so.

Soundness: only :meth:`Symmetry.apply` ever changes ``θ_B``, with elements of certified groups, so ``g·θ_B``
computes ``θ_B``'s function to rounding; the tests assert it on every model.

>>> import torch, symalg
>>> from torch import nn
>>> _ = torch.manual_seed(0)
>>> net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 2)).double()
>>> x = torch.randn(5, 3, dtype=torch.float64)
>>> analysis = symalg.derive(symalg.trace(net, (x,)))
>>> a = {k: v.detach() for k, v in net.named_parameters()}
>>> perm, d = torch.randperm(6), torch.rand(6, dtype=torch.float64) + 0.5
>>> b = {"0.weight": d[:, None] * a["0.weight"][perm], "0.bias": d * a["0.bias"][perm],
...      "2.weight": a["2.weight"][:, perm] / d, "2.bias": a["2.bias"]}
>>> aligned = weight_matching(analysis, a, b, kinds=("S", "PS"))
>>> max(float((aligned.params[k] - a[k]).abs().max()) for k in a) < 1e-6   # the hidden scrambling is undone
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call

from symalg.errors import SpecError
from symalg.symbolic.derive import Analysis
from symalg.symbolic.symmetry import Symmetry

__all__ = ["ALIGNABLE", "PRESETS", "Alignment", "activation_matching", "interpolation_losses", "loss_barrier",
           "weight_distance", "weight_matching"]

Params = Mapping[str, torch.Tensor]

ALIGNABLE = ("S", "PS", "O", "GL")
"""The group kinds alignment solves for, in the order a sweep visits them."""

PRESETS: dict[str, tuple[str, ...]] = {"none": (), "permutation": ("S",), "permutation+scaling": ("S", "PS"),
                                       "permutation+scaling+GL/O": ("S", "PS", "O", "GL")}
"""The group sets compared in ``docs/alignment.md``: none, git re-basin, plus ReLU scalings, plus linear maps."""


@dataclass(frozen=True)
class Alignment:
    """``params = g·θ_B``; ``elements`` the ``(symmetry label, g)`` applied, in order; ``methods`` how each symmetry's
    element was found; ``distances`` ``‖θ_A − θ_B'‖`` before and after each sweep (weight matching)."""

    params: dict[str, torch.Tensor]
    elements: tuple[tuple[str, torch.Tensor], ...]
    methods: dict[str, str]
    distances: tuple[float, ...] = ()


def weight_distance(a: Params, b: Params) -> float:
    """``‖a − b‖₂`` over the tensors of ``a`` (both dicts hold them)."""
    return math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in a))


def _selected(analysis: Analysis, kinds: Sequence[str]) -> list[Symmetry]:
    unknown = [k for k in kinds if k not in ALIGNABLE]
    if unknown:
        raise ValueError(f"kinds: {unknown} cannot be aligned; choose from {ALIGNABLE}")
    order = {k: i for i, k in enumerate(kinds)}
    chosen = [s for s in analysis.symmetries if s.group.kind in order]
    return sorted(chosen, key=lambda s: order[str(s.group.kind)])


def _regions(sym: Symmetry, params: Params) -> list[tuple[torch.Tensor, str, float]]:
    """``(U, role, power)`` of every region the symmetry moves, unfolded to ``h`` rows and flattened."""
    out = []
    for b in sym.moving_bindings():
        U = b.unfold(params[b.tensor])
        out.append((U.reshape(U.shape[0], -1), b.role, float(b.power)))
    return out


def _permutation(score: torch.Tensor) -> torch.Tensor:
    """The permutation matrix ``P`` maximising ``tr(Pᵀ score)``: ``P[i, j] = 1`` sends unit ``j`` of B to slot ``i``."""
    from scipy.optimize import linear_sum_assignment
    rows, cols = linear_sum_assignment(score.detach().cpu().numpy(), maximize=True)
    P = torch.zeros_like(score)
    P[torch.as_tensor(rows), torch.as_tensor(cols)] = 1
    return P


def _cross(ra: list, rb: list) -> torch.Tensor:
    """``C = Σ_regions U_A U_Bᵀ`` (``h × h``): ``tr(gᵀ C)`` is the cross term of ``J`` for ``g`` acting on rows."""
    h = ra[0][0].shape[0]
    return sum((A @ B.mT for (A, _, _), (B, _, _) in zip(ra, rb)), torch.zeros(h, h, dtype=ra[0][0].dtype))


def _procrustes(C: torch.Tensor) -> torch.Tensor:
    """``argmax_{g ∈ O(h)} tr(gᵀ C) = U Vᵀ`` for ``C = U Σ Vᵀ``."""
    U, _, Vh = torch.linalg.svd(C)
    return U @ Vh


def _scaling(ra: list[tuple[torch.Tensor, str, float]], rb: list[tuple[torch.Tensor, str, float]],
             grid: int = 801, span: float = 8.0, refine: int = 40) -> torch.Tensor:
    """Per-unit ``d > 0`` minimising ``Σ_b ‖a_b − d^{e_b} b_b‖²`` (``e_b = p`` out, ``−p`` in) over ``log d``."""
    cross = [((A * B).sum(1), (B * B).sum(1), p if role == "out" else -p) for (A, role, p), (B, _, _) in zip(ra, rb)]

    def cost(u: torch.Tensor) -> torch.Tensor:   # u: (..., h) log-scales; the constant Σ‖a‖² dropped
        return sum((-2 * torch.exp(e * u) * x + torch.exp(2 * e * u) * y for x, y, e in cross),
                   torch.zeros_like(u))
    h = ra[0][0].shape[0]
    dtype = ra[0][0].dtype
    us = torch.linspace(-span, span, grid, dtype=dtype)        # contains 0: never worse than the identity
    best = us[cost(us[:, None].expand(grid, h)).argmin(0)]
    step = 2 * span / (grid - 1)
    lo, hi = best - step, best + step
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(refine):                                    # golden section in the bracketing cell
        c, d = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        left = cost(c) < cost(d)
        hi, lo = torch.where(left, d, hi), torch.where(left, lo, c)
    refined = (lo + hi) / 2
    return torch.exp(torch.where(cost(refined) < cost(best), refined, best))


def _gl_cost(g: torch.Tensor, ra: list, rb: list) -> torch.Tensor:
    inv_t = torch.linalg.inv(g).mT
    return sum((((A - (g if role == "out" else inv_t) @ B) ** 2).sum() for (A, role, _), (B, _, _) in zip(ra, rb)),
               torch.zeros((), dtype=g.dtype))


def _general_linear(ra: list, rb: list, steps: int, tolerance: float) -> torch.Tensor:
    """``g ∈ GL(h)`` lowering ``Σ_out ‖A − gB‖² + Σ_in ‖A − g^{−T}B‖²`` (L-BFGS from Procrustes, else ``I``; it stops
    when the largest gradient entry falls below ``tolerance`` times the cost at the start, or a step changes the cost
    or ``g`` by less than ``tolerance²`` of it)."""
    h, dtype = ra[0][0].shape[0], ra[0][0].dtype
    eye = torch.eye(h, dtype=dtype)
    start = _procrustes(_cross(ra, rb))
    base = float(_gl_cost(eye, ra, rb))
    if float(_gl_cost(start, ra, rb)) > base:
        start = eye
    g = start.clone().requires_grad_(True)
    scale = max(float(_gl_cost(start, ra, rb)), torch.finfo(dtype).tiny)
    opt = torch.optim.LBFGS([g], max_iter=steps, line_search_fn="strong_wolfe", tolerance_grad=tolerance * scale,
                            tolerance_change=tolerance ** 2 * scale)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = _gl_cost(g, ra, rb)
        value.backward()
        return value
    try:
        opt.step(closure)
    except torch.linalg.LinAlgError:     # the line search reached a singular g: keep the start
        return start
    g = g.detach()
    ok = bool(torch.isfinite(g).all()) and torch.linalg.cond(g) < 1e8
    return g if ok and float(_gl_cost(g, ra, rb)) < min(base, float(_gl_cost(start, ra, rb))) else start


def _weight_element(sym: Symmetry, params_a: Params, params_b: Params, gl_steps: int,
                    gl_tolerance: float) -> torch.Tensor:
    ra, rb = _regions(sym, params_a), _regions(sym, params_b)
    kind = sym.group.kind
    if kind == "PS":
        return _scaling(ra, rb)
    if kind == "GL":
        return _general_linear(ra, rb, gl_steps, gl_tolerance)
    return (_permutation if kind == "S" else _procrustes)(_cross(ra, rb))


def _check_gl(gl_steps: object, gl_tolerance: object, where: str) -> None:
    if isinstance(gl_steps, bool) or not isinstance(gl_steps, int) or gl_steps < 1:
        raise SpecError(f"{where}: gl_steps must be a positive integer, got {gl_steps!r}")
    if isinstance(gl_tolerance, bool) or not isinstance(gl_tolerance, (int, float)) or \
            not 0 < gl_tolerance < math.inf:
        raise SpecError(f"{where}: gl_tolerance must be a positive number, got {gl_tolerance!r}")


def _detached(params: Params) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in params.items()}


def weight_matching(analysis: Analysis, params_a: Params, params_b: Params,
                    kinds: Sequence[str] = ALIGNABLE, sweeps: int = 4, gl_steps: int = 50,
                    gl_tolerance: float = 1e-10) -> Alignment:
    """Align ``θ_B`` to ``θ_A`` by weight matching over the analysis' symmetries of the given ``kinds``.

    ``sweeps`` rounds of block coordinate descent (each symmetry solved with the others fixed, see the module
    docstring); ``Alignment.distances[i]`` is ``‖θ_A − θ_B'‖`` after sweep ``i`` (index 0: before), non-increasing.
    ``gl_steps`` and ``gl_tolerance`` bound each ``GL`` solve's L-BFGS (``gl_tolerance`` relative to the site's
    cost at the start, where torch's defaults are absolute). On one ``GL(8)`` site whose exact answer is 0 the
    solve needs ``gl_steps`` in the thousands and stops near ``4e-6`` relative distance; coupled ``GL`` sites (the
    per-head maps of attention) converge only linearly in ``sweeps`` (about 3× per sweep).
    """
    _check_gl(gl_steps, gl_tolerance, "weight_matching")
    a, b = _detached(params_a), _detached(params_b)
    chosen, elements = _selected(analysis, kinds), []
    distances = [weight_distance(a, b)]
    for _ in range(sweeps if chosen else 0):
        for sym in chosen:
            g = _weight_element(sym, a, b, gl_steps, gl_tolerance)
            b = sym.apply(b, g)
            elements.append((sym.label, g))
        distances.append(weight_distance(a, b))
    return Alignment(b, tuple(elements), {s.label: "weights" for s in chosen}, tuple(distances))


def _site_values(model: nn.Module, params: Params, x: torch.Tensor, site: str) -> torch.Tensor:
    """The output of module ``site`` on ``x`` at ``params``, as rows ``(N, h)``."""
    module, seen = model.get_submodule(site), []
    handle = module.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with torch.no_grad():
            functional_call(model, dict(params), (x,))
    finally:
        handle.remove()
    return seen[0].reshape(-1, seen[0].shape[-1])


def _activation_element(kind: str, za: torch.Tensor, zb: torch.Tensor) -> torch.Tensor | None:
    """``g`` fitted so that ``z_B ↦ g z_B`` matches ``z_A`` (rows); ``None`` where the values cannot determine it."""
    if kind == "S":
        return _permutation(za.mT @ zb)
    if kind == "PS":
        tiny = torch.finfo(zb.dtype).tiny
        na, nb = za.norm(dim=0), zb.norm(dim=0)
        return torch.where((na > tiny) & (nb > tiny), na / nb.clamp_min(tiny), torch.ones_like(na))
    if int(torch.linalg.matrix_rank(zb)) < zb.shape[1]:
        return None
    if kind == "O":
        return _procrustes(za.mT @ zb)
    return torch.linalg.lstsq(zb, za).solution.mT


def activation_matching(analysis: Analysis, model: nn.Module, params_a: Params, params_b: Params, x: torch.Tensor,
                        kinds: Sequence[str] = ALIGNABLE, gl_steps: int = 50,
                        gl_tolerance: float = 1e-10) -> Alignment:
    """Align ``θ_B`` to ``θ_A`` by matching the values of each symmetry's site on the inputs ``x``.

    One pass (an element acts only on its own site's values, so sites do not interact); a symmetry whose site is not
    a module of ``model`` with outputs of the group's width, or whose values are rank deficient (``GL``, ``O``),
    is solved by weight matching instead (``Alignment.methods``).
    """
    _check_gl(gl_steps, gl_tolerance, "activation_matching")
    a, b = _detached(params_a), _detached(params_b)
    modules, elements, methods = dict(model.named_modules()), [], {}
    for sym in _selected(analysis, kinds):
        width = sym.moving_bindings()[0].unfold(b[sym.moving_bindings()[0].tensor]).shape[0]
        g = None
        if sym.site in modules:
            za, zb = _site_values(model, a, x, sym.site), _site_values(model, b, x, sym.site)
            g = _activation_element(str(sym.group.kind), za, zb) if za.shape[1] == width else None
        methods[sym.label] = "activations" if g is not None else "weights"
        if g is None:
            g = _weight_element(sym, a, b, gl_steps, gl_tolerance)
        b = sym.apply(b, g)
        elements.append((sym.label, g))
    return Alignment(b, tuple(elements), methods, (weight_distance(a, _detached(params_b)), weight_distance(a, b)))


def interpolation_losses(loss: Callable[[dict[str, torch.Tensor]], torch.Tensor], params_a: Params, params_b: Params,
                         alphas: torch.Tensor) -> torch.Tensor:
    """``L((1−α)θ_A + αθ_B)`` at each ``α``."""
    with torch.no_grad():
        return torch.stack([loss({k: (1 - float(t)) * params_a[k] + float(t) * params_b[k] for k in params_a})
                            for t in alphas])


def loss_barrier(loss: Callable[[dict[str, torch.Tensor]], torch.Tensor], params_a: Params, params_b: Params,
                 points: int = 21) -> float:
    """``max_α [L((1−α)θ_A + αθ_B) − ((1−α)L(θ_A) + αL(θ_B))]`` on ``points`` equally spaced ``α ∈ [0, 1]``.

    >>> a, b = {"w": torch.zeros(1)}, {"w": torch.full((1,), 2.0)}
    >>> loss_barrier(lambda p: (p["w"] * (2 - p["w"])).sum(), a, b, points=3)   # a bump of height 1 at α = ½
    1.0
    """
    alphas = torch.linspace(0, 1, points, dtype=torch.float64)
    values = interpolation_losses(loss, params_a, params_b, alphas).double()
    return float((values - ((1 - alphas) * values[0] + alphas * values[-1])).max())
