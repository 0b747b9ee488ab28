"""Teleportation actions for bijective activations ([Zhao2026] Sec. 4.4.2, eqs. 4.13 and 4.16), and
a function measuring any action's loss change and group-axiom errors.

Both act on one hidden site ``s`` (the output of linear layer ``s``, 0-based; [Zhao2026]'s ``m−1``),
with ``g ∈ GL(d_s)``. Paper layout inside: ``h = a_{s−1} ∈ R^{d×k}`` is the layer's input with a row of
ones appended when the layer has a bias (``W̃ = [W b]``), ``A = W̃ h`` the pre-activation, ``⁺`` the
pseudo-inverse.

**Eq. 4.13, "exact"** (:class:`ExactTeleport`, needs ``σ⁻¹``)::

    W̃_s' = σ⁻¹(g σ(A)) h⁺        W_{s+1}' = W_{s+1} g⁻¹

With ``T = σ⁻¹(g σ(A))``, ``a_s' = σ(T h⁺h)``, so the network's output on the batch is preserved iff
``row(T) ⊆ row(h)``, guaranteed when ``h⁺h = I_k`` (rank ``h = k``: ``k ≤ d``); the multiplication axiom
follows from it. The unit axiom ``W̃ h h⁺ = W̃`` holds for every ``W̃`` iff ``h h⁺ = I`` (rank ``h = d``:
``k ≥ d``). A true group action therefore needs ``h`` square and invertible (``k = d``), [Zhao2026]'s
hypothesis; with ``k < d`` the pseudo-inverse version keeps the loss but fails the unit axiom (``e·W̃``
projects the rows of ``W̃`` onto ``col(h)``, the span of the data). ``complete=True`` adds ``W̃(I − h h⁺)``
back, which makes it a group action whenever rank ``h = k``.

**Eq. 4.16, "approximate"** (:class:`ApproximateTeleport`)::

    W_{s+1}' = W_{s+1} σ(A) σ(gA)⁺        W_s' = g W_s,  b_s' = g b_s

The output is ``W_{s+1} σ(A) σ(gA)⁺ σ(gA)``: exact iff ``row σ(A) ⊆ row σ(gA)``, guaranteed when
``σ(gA)⁺σ(gA) = I_k`` (rank ``k``: batch ``k ≤`` width ``d_s``, necessary but not sufficient: a site wider
than its input with a piecewise-linear σ can stay below rank ``k``); the multiplication axiom follows from
it. For ``k > d_s`` it is the least-squares best ``U'`` (no ``U'`` does better: the batch-size limit of
:mod:`symalg.applications.nonlinear_actions`). The unit axiom needs ``σ(A)σ(A)⁺ = I`` (rank ``d_s``: ``k ≥ d_s``).
So with pseudo-inverses it too fails the unit axiom for ``k < d_s``;
:class:`~symalg.applications.nonlinear_actions.DataDependentAction` (QR frames instead of pseudo-inverses) is an exact
group action for all ``k ≤ d_s`` where the ranks are full.

Conventions: torch layouts (``W ∈ R^{out×in}``, data rows ``x (k, n)``); actions are callables
``action(params, g, x) → params`` (``g`` a matrix, or one per site for ``DataDependentAction``).

Example
-------
>>> import torch
>>> from torch import nn
>>> from symalg.applications.nonlinear_actions import random_gl
>>> from symalg.applications.teleport_actions import ApproximateTeleport, measure_action
>>> from symalg.numeric.feedforward import FeedForward
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 3)).double()
>>> net, params = FeedForward.of(model), dict(model.named_parameters())
>>> x, y = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
>>> loss = lambda p: ((net.forward(p, x) - y) ** 2).mean()
>>> g1, g2 = random_gl(6, dtype=torch.float64), random_gl(6, dtype=torch.float64)
>>> m = measure_action(ApproximateTeleport(net, 0), params, x, g1, g2, loss=loss)
>>> m.relative_loss_change < 1e-10, m.identity_error > 1e-3   # batch 5 ≤ width 6: exact loss, no unit axiom
(True, True)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, cast

import torch
from torch import nn
from torch.nn import functional as F

from symalg.applications.nonlinear_actions import _columns, _right_divide
from symalg.frontend.canonical import module_activation
from symalg.numeric.feedforward import FeedForward, SiteElements, _rows

__all__ = ["ActionConditions", "ActionMeasurement", "ApproximateTeleport", "BijectiveActivation", "ExactTeleport",
           "as_bijective", "extended_tanh", "leaky_relu", "measure_action"]


# --------------------------------------------------------------------------------- bijective activations

class BijectiveActivation(nn.Module):
    """An elementwise bijection ``σ: R → R`` with its inverse (needed by eq. 4.13), usable as a module.

    >>> act = BijectiveActivation("cube", lambda z: z ** 3, lambda y: y.sign() * y.abs() ** (1 / 3))
    >>> act.inverse(act(torch.tensor([-2.0, 0.5])))
    tensor([-2.0000,  0.5000])
    """

    def __init__(self, name: str, forward: Callable[[torch.Tensor], torch.Tensor],
                 inverse: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.name, self._forward, self.inverse = name, forward, inverse

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self._forward(z)

    def extra_repr(self) -> str:
        return self.name


def leaky_relu(slope: float = 0.01) -> BijectiveActivation:
    """Torch's ``leaky_relu(z) = max(z, 0) + slope·min(z, 0)``, bijective for ``slope > 0``.

    >>> leaky_relu(0.1).inverse(torch.tensor([-0.2, 3.0]))
    tensor([-2.,  3.])
    """
    if not slope > 0:
        raise ValueError(f"leaky_relu: slope {slope} must be > 0 for a bijection")
    return BijectiveActivation(f"leaky_relu({slope})", lambda z: F.leaky_relu(z, slope),
                               lambda y: F.leaky_relu(y, 1 / slope))   # one kernel: 16× faster than torch.where


def extended_tanh(n: float = 10.0) -> BijectiveActivation:
    """``σ(y) = tanh(y) + 2e^{−N} sinh(y) = tanh(y) + e^{y−N} − e^{−y−N}``, a bijection of ``R`` within
    ``2e^{−N} sinh|y|`` of ``tanh`` ([Zhao2026] prints ``e^{x−N} − e^{−x+N}``, which is ``−2 sinh(N−x)``:
    about ``−e^N`` at ``x = 0``, nowhere near ``tanh``).

    The inverse brackets the root in ``[asinh((t−1)/2ε), asinh((t+1)/2ε)]`` (``ε = e^{−N}``, since
    ``|tanh| < 1``), bisects, then polishes with two Newton steps.

    >>> s = extended_tanh(10.0)
    >>> t = torch.tensor([-3.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    >>> bool((s(s.inverse(t)) - t).abs().max() < 1e-12)
    True
    """
    eps2 = 2 * math.exp(-n)

    def forward(y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(y) + eps2 * torch.sinh(y)

    def inverse(t: torch.Tensor) -> torch.Tensor:
        lo, hi = torch.asinh((t - 1) / eps2), torch.asinh((t + 1) / eps2)
        for _ in range(64):
            mid = (lo + hi) / 2
            below = forward(mid) < t
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        y = (lo + hi) / 2
        for _ in range(2):
            y = y - (forward(y) - t) / (1 - torch.tanh(y) ** 2 + eps2 * torch.cosh(y))
        return y

    return BijectiveActivation(f"extended_tanh(N={n})", forward, inverse)


def as_bijective(activation: Callable[[torch.Tensor], torch.Tensor]) -> BijectiveActivation:
    """``activation`` itself, or the bijection for a leaky ReLU (slope ``> 0``) or the identity, read off the
    catalogue op of the activation module (``nn.LeakyReLU``, ``Activation("leaky_relu", slope=...)``, the views
    of :class:`~symalg.numeric.feedforward.FeedForward`); ``TypeError`` otherwise.

    >>> as_bijective(torch.nn.LeakyReLU(0.5)).inverse(torch.tensor([-1.0, 2.0]))
    tensor([-2.,  2.])
    """
    if isinstance(activation, BijectiveActivation):
        return activation
    op, params = (module_activation(activation) if isinstance(activation, nn.Module) else None) or (None, {})
    if op == "leaky_relu":
        return leaky_relu(float(params["slope"]))
    if op == "identity":
        return BijectiveActivation("identity", lambda z: z, lambda z: z)
    raise TypeError(f"activation {activation!r} has no known inverse: pass a BijectiveActivation "
                    "(leaky_relu, extended_tanh, or your own forward/inverse pair)")


# ------------------------------------------------------------------------------------------------ actions

@dataclass(frozen=True)
class ActionConditions:
    """Which properties a teleportation action has at given parameters, data and ``g``, and why.

    ``loss_preserving``: the output on the batch is unchanged for every consuming weight (a row-space
    inclusion, tested at this ``g``). ``identity_axiom``: ``e·θ = θ`` for every weight of the site (a rank
    condition). ``group_action``: both axioms and loss preservation hold for every ``g`` near this one
    (square, invertible case). ``rank`` is the rank that decides, ``width`` what the batch ``k`` is
    compared with; with leading draws, the worst draw counts.
    """

    label: str
    batch: int
    width: int
    rank: int
    loss_preserving: bool
    identity_axiom: bool
    group_action: bool
    reason: str

    @property
    def composition_axiom(self) -> bool:
        """``g₁·(g·θ) = (g₁g)·θ`` for every ``g₁`` is guaranteed: it follows from ``loss_preserving`` (for
        special data it can hold without)."""
        return self.loss_preserving

    def __str__(self) -> str:
        def yes(b: bool) -> str:
            return "yes" if b else "no"
        return (f"{self.label}: batch k = {self.batch}, width {self.width}, rank {self.rank}: loss preserved "
                f"{yes(self.loss_preserving)}, unit axiom {yes(self.identity_axiom)}, multiplication axiom "
                f"{'guaranteed' if self.composition_axiom else 'not guaranteed'}, group action "
                f"{yes(self.group_action)} ({self.reason})")


def _min_rank(a: torch.Tensor) -> int:
    return int(torch.linalg.matrix_rank(a).min())


def _rows_within(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``row(a) ⊆ row(b)`` for every draw (ranks of the blocks scaled to unit norm)."""
    def unit(m: torch.Tensor) -> torch.Tensor:
        return m / torch.linalg.matrix_norm(m)[..., None, None].clamp_min(torch.finfo(m.dtype).tiny)
    stacked = torch.linalg.matrix_rank(torch.cat([unit(b), unit(a)], -2))
    return bool((stacked == torch.linalg.matrix_rank(unit(b))).all())


def _reusable(seen: list[Any], tensors: tuple[torch.Tensor, ...]) -> bool:
    """Whether ``seen`` (``[(((tensor, version), …), value)]`` or empty) was remembered for these very tensors,
    unmodified since (same ``_version``)."""
    if not seen or len(seen[0][0]) != len(tensors):
        return False
    return all(a is t and v == t._version for (a, v), t in zip(seen[0][0], tensors))


def _remember(seen: list[Any], tensors: tuple[torch.Tensor, ...], value: Any) -> None:
    """Keep ``value`` for ``tensors`` (one entry: the last), unless one of them is differentiated (a value computed
    from them would carry a graph that a later backward pass must not reuse)."""
    if not any(t.requires_grad for t in tensors):
        seen[:] = [(tuple((t, t._version) for t in tensors), value)]


@dataclass(frozen=True)
class _SiteAction:
    """Shared plumbing: the site's layers and the data entering them (paper layout)."""

    net: FeedForward
    site: int

    def __post_init__(self) -> None:
        if not 0 <= self.site < self.net.sites:
            raise ValueError(f"site {self.site} out of range: the network has hidden sites 0…{self.net.sites - 1}")

    def _inputs(self) -> tuple[str, ...]:
        """The parameters the layer's input ``h`` depends on (those of the layers below the site)."""
        names = self.net.weights[:self.site] + self.net.biases[:self.site]
        return tuple(n for n in names if n is not None)

    def _input(self, params: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``h = [a; 1]``, the input of layer ``site`` (with a row of ones when it has a bias), ``(…, d, k)``."""
        s, net = self.site, self.net
        a = _rows(x) if s == 0 else net.activations[s - 1](net.preactivations(params, x, layers=s)[s - 1])
        if net.biases[s] is not None:
            a = torch.cat([a, torch.ones_like(a[..., :1])], -1)
        return a.transpose(-1, -2)

    def _weight(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``W̃ = [W b]`` of layer ``site``."""
        w, b = params[self.net.weights[self.site]], self.net.biases[self.site]
        return w if b is None else torch.cat([w, params[b].unsqueeze(-1)], -1)

    def _parts(self, params: Mapping[str, torch.Tensor], x: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(W̃ = [W b], h = [a; 1], A = W̃ h)`` for layer ``site``, all ``(…, rows, cols)``."""
        w, h = self._weight(params), self._input(params, x)
        return w, h, w @ h

    def _check(self, g: torch.Tensor, params: Mapping[str, torch.Tensor]) -> None:
        width = params[self.net.weights[self.site]].shape[-2]
        if g.shape[-2:] != (width, width):
            raise ValueError(f"g: shape {tuple(g.shape)}, expected (…, {width}, {width}) for site {self.site}")

    def _store(self, params: Mapping[str, torch.Tensor], w_tilde: torch.Tensor,
               w_next: torch.Tensor) -> dict[str, torch.Tensor]:
        s, net = self.site, self.net
        out = dict(params)
        bias = net.biases[s]
        if bias is None:
            out[net.weights[s]] = w_tilde
        else:
            out[net.weights[s]], out[bias] = w_tilde[..., :-1], w_tilde[..., -1]
        out[net.weights[s + 1]] = w_next
        return out


class _FirstOrder(torch.autograd.Function):
    """``C ↦ (D ⊙ (C S)) h⁺`` evaluated at ``C = 0`` (its value, zero, is not computed): the backward pass gives
    ``∂/∂C = ((G h⁺ᵀ) ⊙ D) Sᵀ`` for an incoming gradient ``G`` (differentiable in turn)."""

    @staticmethod
    def forward(ctx: Any, C: torch.Tensor, S: torch.Tensor, D: torch.Tensor, h_pinv: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(S, D, h_pinv)
        shape = torch.broadcast_shapes(C.shape[:-2], S.shape[:-2], h_pinv.shape[:-2])
        return C.new_zeros(*shape, C.shape[-2], h_pinv.shape[-1])

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        S, D, h_pinv = ctx.saved_tensors
        return ((grads[0] @ h_pinv.mT) * D) @ S.mT, None, None, None


@dataclass(frozen=True)
class ExactTeleport(_SiteAction):
    """Eq. 4.13: ``W̃_s' = σ⁻¹(g σ(W̃_s h)) h⁺``, ``W_{s+1}' = W_{s+1} g⁻¹`` (Prop. 4.4.2).

    Labelled **exact**: it preserves the output on the batch whenever ``h`` has rank ``k`` (``k ≤ d``,
    ``d`` = the layer's input width, +1 with a bias); it is a true group action only when ``h`` is square
    and invertible, since the unit axiom needs ``h h⁺ = I``. ``complete=True`` adds ``W̃_s(I − h h⁺)``,
    making it a group action for every rank-``k`` ``h``. ``activation``: σ with its inverse (default: the
    site's activation through :func:`as_bijective`).
    """

    activation: BijectiveActivation | None = None
    complete: bool = False
    exact = True
    _inputs_seen: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _outputs_seen: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)
    _bijection: list[Any] = field(default_factory=list, init=False, repr=False, compare=False)

    @property
    def label(self) -> str:
        return "eq. 4.13 (exact" + (", completed)" if self.complete else ")")

    def _sigma(self) -> BijectiveActivation:
        """σ with its inverse (made once: :func:`as_bijective` builds a module)."""
        if not self._bijection:
            self._bijection.append(as_bijective(self.activation or self.net.activations[self.site]))
        return cast(BijectiveActivation, self._bijection[0])

    def _input_and_pinv(self, params: Mapping[str, torch.Tensor], x: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """``(h, h⁺, h⁺h = I)``. The action moves ``W̃_s`` and ``W_{s+1}`` only, so ``h`` (a function of ``x`` and the
        layers below) stays the same along a teleport: the last triple is reused while ``x`` and those parameters
        are the same tensors, unmodified and not differentiated (:func:`_reusable`)."""
        sources = (x, *(params[n] for n in self._inputs()))
        if _reusable(self._inputs_seen, sources):
            return self._inputs_seen[0][1]
        h = self._input(params, x)
        h_pinv = torch.linalg.pinv(h)
        k = h.shape[-1]
        eye = torch.eye(k, dtype=h.dtype, device=h.device)
        left = bool(((h_pinv @ h - eye).abs().amax() <= 64 * k * torch.finfo(h.dtype).eps).all())
        _remember(self._inputs_seen, sources, (h, h_pinv, left))
        return h, h_pinv, left

    def _pre_activation(self, params: Mapping[str, torch.Tensor], h: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(A = W̃h, W̃ or None)``: ``A`` kept from the call that produced these weights where possible (see
        :meth:`__call__`), else computed; ``W̃`` only where it was read."""
        weight, bias = self.net.weights[self.site], self.net.biases[self.site]
        mine = (params[weight],) + (() if bias is None else (params[bias],))
        if not self.complete and _reusable(self._outputs_seen, mine):
            return self._outputs_seen[0][1], None
        w = self._weight(params)
        return w @ h, w

    def __call__(self, params: Mapping[str, torch.Tensor], g: torch.Tensor, x: torch.Tensor,
                 g_inv: torch.Tensor | None = None) -> dict:
        """The moved parameters; ``g_inv``: ``g⁻¹`` where the caller has it (``exp(−C)`` for ``g = exp(C)``),
        default a linear solve.

        When ``h⁺h = I`` (rank ``h = k``), the moved ``W̃' = T h⁺`` (``T = σ⁻¹(gσ(A))``, plus ``W̃(I − hh⁺)`` when
        completed) has ``W̃'h = T``: the pre-activation of the next call on these tensors is ``T``, kept instead of
        recomputed (one ``n × d × k`` product fewer per step of a teleport; equal to rounding)."""
        self._check(g, params)
        sigma = self._sigma()
        h, h_pinv, left = self._input_and_pinv(params, x)
        weight, bias = self.net.weights[self.site], self.net.biases[self.site]
        pre, w = self._pre_activation(params, h)
        target = _columns(sigma.inverse, g @ _columns(sigma, pre))
        w_new = target @ h_pinv
        if self.complete:
            assert w is not None, "a completed action always reads W̃"
            w_new = w_new + w - pre @ h_pinv
        w_next = params[self.net.weights[self.site + 1]]
        out = self._store(params, w_new, _right_divide(w_next, g) if g_inv is None else w_next @ g_inv)
        if left and not target.requires_grad:
            _remember(self._outputs_seen, (out[weight],) + (() if bias is None else (out[bias],)), target)
        return out

    def first_order(self, params: Mapping[str, torch.Tensor], C: torch.Tensor, x: torch.Tensor) -> dict:
        """The action at ``g = I + C`` to first order at ``C = 0``: the value of the action at ``g = I`` and its
        derivative in ``C``, ``W̃' = W̃' (I) + [(σ⁻¹)'(S) ⊙ (C S)] h⁺`` (``S = σ(A)``), ``W_{s+1}' = W_{s+1}(I − C)``,
        without computing the derivative term's (zero) value: the ``n × d`` product with ``h⁺`` is left to the
        backward pass (:class:`_FirstOrder`). ``W̃'(I) = W̃hh⁺`` (``W̃`` itself when completed, or when ``W̃ = Th⁺``
        came from this action: then ``W̃hh⁺ = W̃``). Only derivatives in ``C`` are kept in the derivative term (not
        its own dependence on the parameters): what an ascent step on the coordinates takes."""
        self._check(C, params)
        sigma = self._sigma()
        h, h_pinv, _ = self._input_and_pinv(params, x)
        pre, w = self._pre_activation(params, h)
        if w is None or self.complete:
            base = self._weight(params) if w is None else w
        else:
            base = pre @ h_pinv
        S = _columns(sigma, pre).detach()
        leaf = S.requires_grad_(True)
        with torch.enable_grad():                        # (σ⁻¹)' at S, elementwise: the gradient of a sum
            (slope,) = torch.autograd.grad(_columns(sigma.inverse, leaf).sum(), leaf)
        w_new = base + _FirstOrder.apply(C, S.detach(), slope, h_pinv)
        w_next = params[self.net.weights[self.site + 1]]
        return self._store(params, w_new, w_next - w_next @ C)

    def conditions(self, params: Mapping[str, torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> ActionConditions:
        """:class:`ActionConditions` at ``(params, x, g)``: output kept iff ``row(σ⁻¹(gσ(A))) ⊆ row(h)``
        (always when rank ``h = k``); unit axiom iff rank ``h = d`` (always when completed)."""
        self._check(g, params)
        sigma = self._sigma()
        _, h, pre = self._parts(params, x)
        d, k = h.shape[-2:]
        r = _min_rank(h)
        loss = _rows_within(_columns(sigma.inverse, g @ _columns(sigma, pre)), h)
        unit = self.complete or r == d
        return ActionConditions(self.label, k, d, r, loss, unit, r == k and unit,
                                f"loss needs row(σ⁻¹(gσ(A))) ⊆ row(h), guaranteed by rank h = k; here rank h = {r}; "
                                + ("unit axiom always (completed)" if self.complete else "unit axiom needs rank h = d"))


@dataclass(frozen=True)
class ApproximateTeleport(_SiteAction):
    """Eq. 4.16: ``W_{s+1}' = W_{s+1} σ(A) σ(gA)⁺``, ``W_s' = g W_s``, ``b_s' = g b_s``.

    Labelled **approximate**: the output on the batch is preserved iff ``row σ(A) ⊆ row σ(gA)``, e.g. when
    ``σ(gA)`` has rank ``k`` (which needs batch ``k ≤`` width ``d_s``); above the width the residual is the
    least-squares minimum. Unit axiom iff ``σ(A)`` has rank ``d_s``; a true group action only for
    ``k = d_s`` with ``σ(A)``, ``σ(gA)`` invertible.
    """

    exact = False
    label = "eq. 4.16 (approximate)"

    def __call__(self, params: Mapping[str, torch.Tensor], g: torch.Tensor, x: torch.Tensor) -> dict:
        self._check(g, params)
        sigma = self.net.activations[self.site]
        w, _, pre = self._parts(params, x)
        w_next = params[self.net.weights[self.site + 1]] @ _columns(sigma, pre) @ torch.linalg.pinv(
            _columns(sigma, g @ pre))
        return self._store(params, g @ w, w_next)

    def conditions(self, params: Mapping[str, torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> ActionConditions:
        """:class:`ActionConditions` at ``(params, x, g)``: output kept iff ``row(σ(A)) ⊆ row(σ(gA))`` (always
        when rank ``σ(gA) = k``); unit axiom iff rank ``σ(A) = d_s``."""
        self._check(g, params)
        sigma = self.net.activations[self.site]
        _, _, pre = self._parts(params, x)
        d, k = pre.shape[-2:]
        s_a, s_ga = _columns(sigma, pre), _columns(sigma, g @ pre)
        rank_a, rank_ga = _min_rank(s_a), _min_rank(s_ga)
        return ActionConditions(self.label, k, d, rank_ga, _rows_within(s_a, s_ga), rank_a == d,
                                rank_a == rank_ga == k == d,
                                f"loss needs row(σ(A)) ⊆ row(σ(gA)), guaranteed by rank σ(gA) = k; here rank σ(gA) = "
                                f"{rank_ga}; unit axiom needs rank σ(A) = d_s, here {rank_a}")


# ------------------------------------------------------------------------------------------ measurement

def _compose(g1: Any, g2: Any) -> Any:
    """``g₁g₂`` site by site, for each form of :data:`~symalg.numeric.feedforward.SiteElements`."""
    if isinstance(g1, torch.Tensor):
        return g1 @ g2
    if isinstance(g1, Mapping):
        return {s: g1[s] @ g2[s] for s in g1}
    return [None if a is None else a @ b for a, b in zip(g1, g2)]


def _identity(g: SiteElements) -> Any:
    def eye(a: torch.Tensor | None) -> torch.Tensor | None:
        return None if a is None else torch.eye(a.shape[-1], dtype=a.dtype, device=a.device).expand_as(a)
    if isinstance(g, torch.Tensor):
        return eye(g)
    if isinstance(g, Mapping):
        return {s: eye(a) for s, a in g.items()}
    return [eye(a) for a in g]


def _distance(p: Mapping[str, torch.Tensor], q: Mapping[str, torch.Tensor]) -> float:
    """``‖p − q‖ / ‖q‖`` over all tensors (Frobenius)."""
    num = cast(torch.Tensor, sum(((p[k] - q[k]) ** 2).sum() for k in q))   # q is never empty
    den = cast(torch.Tensor, sum((q[k] ** 2).sum() for k in q))
    return (num / den.clamp_min(torch.finfo(den.dtype).tiny)).sqrt().item()


@dataclass(frozen=True)
class ActionMeasurement:
    """What an action did at given parameters and data.

    ``output_change = max|f(g·θ, x) − f(θ, x)| / max|f(θ, x)|``; ``identity_error = ‖e·θ − θ‖/‖θ‖``;
    ``composition_error = ‖g₁·(g₂·θ) − (g₁g₂)·θ‖ / ‖(g₁g₂)·θ‖`` (``None`` without ``g₂``).
    """

    label: str
    loss_before: float
    loss_after: float
    output_change: float | None
    identity_error: float
    composition_error: float | None

    @property
    def loss_change(self) -> float:
        return abs(self.loss_after - self.loss_before)

    @property
    def relative_loss_change(self) -> float:
        return self.loss_change / max(abs(self.loss_before), torch.finfo(torch.float64).tiny)

    def __str__(self) -> str:
        out = "" if self.output_change is None else f", output change {self.output_change:.1e}"
        comp = "" if self.composition_error is None else f", composition error {self.composition_error:.1e}"
        return (f"{self.label}: loss {self.loss_before:.6g} → {self.loss_after:.6g} (relative change "
                f"{self.relative_loss_change:.1e}){out}, identity error {self.identity_error:.1e}{comp}")


def measure_action(action: Callable[[Mapping[str, torch.Tensor], Any, torch.Tensor], dict[str, torch.Tensor]],
                   params: Mapping[str, torch.Tensor], x: torch.Tensor, g1: SiteElements,
                   g2: SiteElements | None = None, *, loss: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
                   forward: Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor] | None = None,
                   label: str | None = None) -> ActionMeasurement:
    """Apply ``action(params, g, x)`` and measure the loss change and the unit/multiplication axiom errors.

    Works for any action of that signature (:class:`ExactTeleport`, :class:`ApproximateTeleport`,
    :class:`~symalg.applications.nonlinear_actions.DataDependentAction`, or your own); ``g`` is a matrix, a sequence
    of matrices (``None`` = identity) or a mapping ``{site: matrix}``, composed entrywise. ``loss(params)``
    gives the scalar loss; ``forward(params, x)`` (optional) the outputs compared on ``x``.
    """
    with torch.no_grad():
        return _measure(action, params, x, g1, g2, loss, forward, label)


def _measure(action: Callable[[Mapping[str, torch.Tensor], Any, torch.Tensor], dict[str, torch.Tensor]],
             params: Mapping[str, torch.Tensor], x: torch.Tensor, g1: SiteElements, g2: SiteElements | None,
             loss: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
             forward: Callable[[Mapping[str, torch.Tensor], torch.Tensor], torch.Tensor] | None,
             label: str | None) -> ActionMeasurement:
    moved = action(params, g1, x)
    output = None
    if forward is not None:
        before = forward(params, x)
        output = ((forward(moved, x) - before).abs().max() / before.abs().max().clamp_min(
            torch.finfo(before.dtype).tiny)).item()
    identity = _distance(action(params, _identity(g1), x), params)
    composition = None
    if g2 is not None:
        both = action(params, _compose(g1, g2), x)
        composition = _distance(action(action(params, g2, x), g1, x), both)
    name = label or str(getattr(action, "label", type(action).__name__))
    return ActionMeasurement(name, loss(params).item(), loss(moved).item(), output, identity, composition)
