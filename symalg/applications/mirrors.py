"""Mirror symmetries of a model and the structured constraints they impose.

A *mirror* is an orthogonal involution ``R`` of the parameters (``R² = I``, ``RᵀR = I`` in the Frobenius metric) that
leaves every per-sample loss invariant. With ``P = (I − R)/2`` (an orthogonal projection) and ``O`` an orthonormal
basis of ``im P``, ``R = I − 2OOᵀ``, and for ``ℓ_γ(θ) = ℓ_0(θ) + γ‖θ‖²`` (the convention used throughout):

1. on the fixed set ``Oᵀθ = 0`` every per-sample gradient satisfies ``Oᵀ∇ℓ_γ = 0``, so GD and SGD with any learning
   rate and weight decay never leave it, and the Fisher information ``J = E[∇ℓ∇ℓᵀ]`` has ``J O = 0`` there;
2. there ``H = ∇²ℓ`` commutes with ``P`` (``PH = HP``: ``H`` is block diagonal in ``im P ⊕ ker P``);
3. for ``Oᵀθ ≠ 0`` and ``γ > γ₀ = (ℓ_0(θ − Pθ) − ℓ_0(θ)) / ‖Pθ‖²`` the projected point has the lower loss.

Every mirror here comes from a group symalg derived: each site group lists its involutions
(:meth:`~symalg.catalogue.groups.SiteGroup.mirrors`: neuron reflections and Householder reflections of ``GL``/``O``
sites, half-turns ``exp(πM/ϑ)`` of compact generators, transpositions of permuted neurons, sign flips of odd
activations, half-turns of rotary planes) and :meth:`~symalg.symbolic.symmetry.Symmetry.apply` lifts ``g`` to ``R``.
An involution ``g = I − 2Π`` of the site moves every region ``U`` by ``g`` (or ``g⁻ᵀ = g``), so ``O`` is ``Π``'s
orthonormal basis ``V`` applied to each region and ``Oᵀθ`` is the list of ``VᵀU``: the constraint reads
"``Vᵀ W_in = 0``, ``Vᵀ b = 0``, ``W_out V = 0``" (dead unit, identical neurons, low rank, sparsity).

>>> import symalg
>>> found = symalg.mirrors(symalg.derive("linear(3, 4) -> tanh -> linear(4, 2)"))
>>> found.mirrors[0].constraint
'dead unit 0: its incoming weights, bias and outgoing weights vanish'
>>> [m.name for m in found.mirrors if m.symmetry.group.symbol == "S"][:1]
['transposition (0 1)']
>>> found.mirrors[-1].constraint
'identical neurons 1 and 2 (homogeneity): equal incoming weights, biases and outgoing weights'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterator, Mapping, Sequence

import sympy as sp
import torch

from symalg.errors import SpecError
from symalg.lowering.codegen import LoweredFunction, lower
from symalg.symbolic.derive import Analysis
from symalg.symbolic.printing import latex
from symalg.symbolic.symmetry import Symmetry, _Symbols

__all__ = ["Mirror", "Mirrors", "mirrors", "MirrorCertificate", "certify", "per_sample_loss",
           "weight_decay_threshold", "GDStability", "gd_stability", "Lyapunov", "lyapunov"]

Params = Mapping[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
"""``(x, y)``: inputs and targets, samples along the first axis."""
Loss = Callable[[Params, Batch], torch.Tensor]
"""``loss(params, batch)``: the per-sample losses of a batch, a vector (see :func:`per_sample_loss`)."""

TOLERANCE = 1e-9


def _orthonormal_image(g: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """An orthonormal basis ``V`` (``h × k``) of ``im Π``, ``Π = (I − g)/2`` (idempotent for an involution, so
    ``k = tr Π``): the QR factor of ``Π Ω`` for a Gaussian ``Ω`` (``h × k``), exact almost surely, ``O(h² k)``."""
    eye = torch.eye(g.shape[-1], dtype=g.dtype, device=g.device)
    projector = (eye - g) / 2
    k = round(float(torch.trace(projector)))
    omega = torch.randn(g.shape[-1], k, generator=generator, dtype=g.dtype).to(g.device)
    V, _ = torch.linalg.qr(projector @ omega)
    return _tidy(V)


def _tidy(V: torch.Tensor) -> torch.Tensor:
    """``V`` with round-off below 1e-14 cleared and each column's largest entry positive (a readable basis)."""
    V = torch.where(V.abs() < 1e-14, torch.zeros_like(V), V)
    signs = torch.sign(V.gather(0, V.abs().argmax(0, keepdim=True)))
    return V * signs


def _classify(V: torch.Tensor, width: int) -> str:
    """The constraint ``VᵀU = 0`` in words (see the module docstring)."""
    support = [int(i) for i in torch.nonzero(V.abs().amax(1) > 1e-9).flatten()]
    k = V.shape[1]
    if len(support) == k:
        if width == 1:
            return "sparsity: the unit's incoming and outgoing weights vanish (the sign of ℝ^×)"
        units = " and ".join(map(str, support))
        return f"dead unit{'s' if k > 1 else ''} {units}: {'their' if k > 1 else 'its'} incoming weights, " \
               f"bias{'es' if k > 1 else ''} and outgoing weights vanish"
    if k == 1 and len(support) == 2:
        i, j = support
        a, b = float(V[i, 0]), float(V[j, 0])
        if abs(abs(a) - abs(b)) < 1e-9:
            kind = "identical" if a * b < 0 else "opposite"
            return f"{kind} neurons {i} and {j} (homogeneity): " + \
                ("equal" if a * b < 0 else "opposite") + " incoming weights, biases and outgoing weights"
    return f"low rank: Vᵀ W_in = 0, Vᵀ b = 0, W_out V = 0 for a {k}-dimensional V (the maps through the site " \
           f"lose rank {k})"


def _flat(tensors: Mapping[str, torch.Tensor], names: Sequence[str]) -> torch.Tensor:
    return torch.cat([tensors[n].reshape(-1) for n in names])


@dataclass(frozen=True, eq=False)
class Mirror:
    """One involution ``g`` of a site group, lifted to the parameters (module docstring).

    Attributes
    ----------
    symmetry : the :class:`~symalg.Symmetry` it belongs to; ``name`` what ``g`` is (``"transposition (0 1)"``).
    g : the site involution (``h × h``); ``basis`` ``V``, an orthonormal basis of ``im (I − g)/2`` (``h × k``).
    reason : None when ``R`` is a mirror (an orthogonal linear involution of the parameters); otherwise why it gives
        no constraint (not orthogonal; affine).
    constraint : the constraint ``Oᵀθ = 0`` in words.
    """

    symmetry: Symmetry
    name: str
    g: torch.Tensor = field(repr=False)
    basis: torch.Tensor = field(repr=False)
    reason: str | None
    constraint: str

    @property
    def gives_constraint(self) -> bool:
        return self.reason is None

    @property
    def label(self) -> str:
        return f"{self.name} of {self.symmetry.label}"

    @property
    def coordinate_compatible(self) -> bool:
        """``R`` is a signed permutation of the parameter entries (``g`` is): Adam's entrywise moments commute with it,
        so Adam keeps the fixed set too. Neuron reflections, transpositions, sign flips and half-turns of coordinate
        planes are; a Householder reflection in a generic direction is not."""
        g = self.g
        entries = g.abs()
        ones = ((entries - 1).abs() < 1e-12) | (entries < 1e-12)
        return bool(ones.all() and (entries > 0.5).sum(0).eq(1).all())

    @property
    def tensors(self) -> tuple[str, ...]:
        return self.symmetry.tensors

    def rank(self) -> int:
        """``dim im P = k · Σ r``: ``k`` the columns of ``V``, ``r`` the columns of each moved region."""
        shapes = self.symmetry.shapes
        return self.basis.shape[1] * sum(math.prod(shapes[b.tensor]) // shapes[b.tensor][b.axis] * b.block
                                          for b in self.symmetry.moving_bindings())

    # -- numeric ---------------------------------------------------------------------------------
    def reflect(self, params: Params) -> dict[str, torch.Tensor]:
        """``Rθ``: every tensor of ``params``, the moved ones reflected."""
        return self.symmetry.apply(params, self.g.to(**self._like(params)), checked=False)

    def project(self, params: Params) -> dict[str, torch.Tensor]:
        """``Pθ = (θ − Rθ)/2`` on the moved tensors (zero elsewhere)."""
        reflected = self.reflect(params)
        return {t: (params[t] - reflected[t]) / 2 if t in self.tensors else torch.zeros_like(params[t])
                for t in params}

    def fixed_point(self, params: Params) -> dict[str, torch.Tensor]:
        """``θ − Pθ = (θ + Rθ)/2``: the nearest point of the fixed set ``Oᵀθ = 0``."""
        reflected = self.reflect(params)
        return {t: (params[t] + reflected[t]) / 2 for t in params}

    def coordinates(self, params: Params) -> dict[str, torch.Tensor]:
        """``Oᵀθ``: ``VᵀU`` for every moved region ``U`` (unfolded to ``h × r``), keyed ``tensor`` or ``tensor#i``."""
        V = self.basis.to(**self._like(params))
        out: dict[str, torch.Tensor] = {}
        for b in self.symmetry.moving_bindings():
            key = b.tensor if b.tensor not in out else f"{b.tensor}#{len(out)}"
            out[key] = V.T @ b.unfold(params[b.tensor])
        return out

    def residual(self, params: Params) -> torch.Tensor:
        """``‖Oᵀθ‖``: zero exactly on the fixed set."""
        return torch.sqrt(sum((c * c).sum() for c in self.coordinates(params).values()))  # type: ignore[arg-type]

    def _like(self, params: Params) -> dict:
        reference = params[self.tensors[0]]
        return dict(dtype=reference.dtype, device=reference.device)

    # -- symbolic ---------------------------------------------------------------------------------
    @cached_property
    def _symbolic(self) -> tuple[sp.MatrixSymbol, dict[str, sp.MatrixExpr], _Symbols]:
        h, k = self.basis.shape
        V = sp.MatrixSymbol("V", h, k)
        symbols = _Symbols(self.symmetry.shapes)
        regions: dict[str, sp.MatrixExpr] = {}
        for b in self.symmetry.moving_bindings():
            key = b.tensor if b.tensor not in regions else f"{b.tensor}#{len(regions)}"
            regions[key] = symbols.region(b)
        return V, regions, symbols

    def expressions(self) -> dict[str, dict[str, sp.MatrixExpr]]:
        """SymPy forms: ``{"P": {region: VVᵀU}, "coordinates": {region: VᵀU}, "residual": {"r2": Σ tr(UᵀVVᵀU)}}``
        (the residual squared; regions in their unfolded ``h × r`` layout, ``V`` an argument)."""
        V, regions, _ = self._symbolic
        return {"P": {key: V * V.T * U for key, U in regions.items()},
                "coordinates": {key: V.T * U for key, U in regions.items()},
                "residual": {"r2": sp.Add(*[sp.Trace(U.T * V * V.T * U) for U in regions.values()])}}

    @cached_property
    def lowered(self) -> dict[str, LoweredFunction]:
        """Torch callables ``f(params, V)`` for ``P``, ``Oᵀθ`` and the squared residual (:meth:`expressions`);
        :meth:`lowered_call` passes ``V``."""
        V, _, symbols = self._symbolic
        name = "".join(c if c.isalnum() else "_" for c in f"{self.symmetry.site}_{self.name}")[:40]
        return {key: lower(f"{key}_{name}", exprs, symbols.reads, args=[V], read_suffixes=symbols.suffixes,
                           vector_inputs=tuple(symbols.vectors))
                for key, exprs in self.expressions().items()}

    def lowered_call(self, which: str, params: Params) -> dict[str, torch.Tensor]:
        """The lowered ``which`` (``"P"``, ``"coordinates"``, ``"residual"``) at ``params``."""
        result: dict[str, torch.Tensor] = self.lowered[which](params, self.basis.to(**self._like(params)))
        return result

    def latex(self) -> str:
        """``R``, ``P`` and the constraint ``Oᵀθ = 0`` in LaTeX."""
        _, regions, _ = self._symbolic
        V = sp.MatrixSymbol("V", *self.basis.shape)
        parts = [latex(V.T * U) + " = 0" for U in regions.values()]
        return (r"R = I - 2VV^\top \text{ on the site }, \; P = \tfrac12 (I - R), \quad "
                + r", \; ".join(parts))

    def __str__(self) -> str:
        tail = self.constraint if self.reason is None else f"no constraint: {self.reason}"
        return f"{self.label}: {tail}"


@dataclass(frozen=True, eq=False)
class Mirrors:
    """What :func:`mirrors` found: the mirrors (and involutions that give no constraint, with the reason) and the
    symmetries without any involution, with the reason."""

    mirrors: tuple[Mirror, ...]
    without: tuple[tuple[str, str], ...]

    def __iter__(self) -> Iterator[Mirror]:
        return iter(self.mirrors)

    def __len__(self) -> int:
        return len(self.mirrors)

    @property
    def constraints(self) -> list[Mirror]:
        """The mirrors that give a constraint ``Oᵀθ = 0``."""
        return [m for m in self.mirrors if m.gives_constraint]

    def latex(self) -> str:
        return "\n".join(rf"\text{{{m.label}}}: {m.latex()}" for m in self.constraints)

    def __str__(self) -> str:
        lines = [str(m) for m in self.mirrors] + [f"{label}: no mirror: {why}" for label, why in self.without]
        return "\n".join(lines)


def _check_mirror(symmetry: Symmetry, g: torch.Tensor, V: torch.Tensor) -> str | None:
    """Why ``R`` (the lift of ``g``) is not an orthogonal linear involution with ``P = OOᵀ``, or None. Measured on a
    random point: ``‖Rθ‖ = ‖θ‖``, ``R²θ = θ`` and ``(θ − Rθ)/2 = O Oᵀθ``."""
    if symmetry.shifts:
        return ("affine involution θ ↦ Rθ + t (the next bias absorbs the shift): its fixed set misses 0, so weight "
                "decay does not favour it")
    generator = torch.Generator().manual_seed(1)
    params = {t: torch.randn(symmetry.shapes[t], generator=generator, dtype=torch.float64)
              for t in symmetry.tensors}
    moved = symmetry.apply(params, g, checked=False)
    names = list(symmetry.tensors)
    x, rx = _flat(params, names), _flat(moved, names)
    z = torch.randn(len(g), 4, generator=generator, dtype=g.dtype)
    if abs(float(rx.norm() / x.norm()) - 1) > TOLERANCE or float((g.T @ (g @ z) - z).norm() / z.norm()) > TOLERANCE:
        return (f"not orthogonal (‖Rθ‖/‖θ‖ = {float(rx.norm() / x.norm()):.4g}): (I − R)/2 is an oblique projection, "
                "the gradient on its fixed set is fixed by Rᵀ, not R, so GD leaves the set, and weight decay breaks R")
    back = _flat(symmetry.apply(moved, g, checked=False), names)
    if float((back - x).norm() / x.norm()) > TOLERANCE:
        return "R² ≠ I on the parameters"
    oot = {t: torch.zeros_like(params[t]) for t in names}
    for b in symmetry.moving_bindings():
        U = b.unfold(params[b.tensor])
        oot[b.tensor] = oot[b.tensor] + b.fold(torch.zeros_like(params[b.tensor]), V @ (V.T @ U))
    if float((_flat(oot, names) - (x - rx) / 2).norm() / x.norm()) > TOLERANCE:
        return "a region is moved twice (bound as input and output): P is not VVᵀ per region"
    return None


def mirrors(analysis: Analysis, limit: int = 4, generator: torch.Generator | None = None) -> Mirrors:
    """The mirrors of every derived symmetry of ``analysis`` (concrete widths), at most ``limit`` per family.

    >>> import symalg
    >>> found = symalg.mirrors(symalg.derive("linear(2, 3) -> relu -> linear(3, 1)"))
    >>> found.without[0]
    ('PositiveScaling(3, alpha=1) on 0', '(ℝ_{>0})^h has no element of order two: a positively homogeneous \
activation commutes with c > 0 only, so the sign of ℝ^× is no symmetry here (only a linear site, GL, has it)')
    """
    if analysis.widths:
        raise SpecError(f"mirrors: the widths {sorted(map(str, analysis.widths))} are symbolic; give them values "
                        "(analysis.subs({...}) or analysis.at_widths_of(params))")
    found: list[Mirror] = []
    without: list[tuple[str, str]] = []
    basis_generator = torch.Generator().manual_seed(4)
    for symmetry in analysis.symmetries:
        group = symmetry.group
        involutions = [] if symmetry.translations or symmetry.acts_on_buffers else group.mirrors(limit, generator)
        if not involutions:
            reason = group.no_mirror or ("it moves buffers (running statistics): not a symmetry of the parameters "
                                         "alone" if symmetry.acts_on_buffers else "its group lists no involution")
            without.append((symmetry.label, reason))
            continue
        for name, g in involutions:
            V = _orthonormal_image(g, basis_generator)
            found.append(Mirror(symmetry, name, g, V, _check_mirror(symmetry, g, V), _classify(V, int(g.shape[0]))))
    return Mirrors(tuple(found), tuple(without))


# -- certification -------------------------------------------------------------------------------------
def per_sample_loss(model: torch.nn.Module, loss: str = "mse") -> Loss:
    """``loss(params, (x, y))``: the per-sample losses of ``model`` at ``params`` (``"mse"``: ``Σ_j (f_j − y_j)²``
    per sample; ``"cross_entropy"``), by :func:`torch.func.functional_call`."""
    def evaluate(params: Params, batch: Batch) -> torch.Tensor:
        x, y = batch
        out = torch.func.functional_call(model, dict(params), (x,))
        if loss == "mse":
            return ((out - y) ** 2).reshape(len(out), -1).sum(-1)
        return torch.nn.functional.cross_entropy(out, y, reduction="none")
    return evaluate


def _grad(loss: Loss, params: Params, batch: Batch) -> dict[str, torch.Tensor]:
    leaves = {t: p.detach().clone().requires_grad_(True) for t, p in params.items()}
    value = loss(leaves, batch).mean()
    grads = torch.autograd.grad(value, list(leaves.values()), allow_unused=True)
    return {t: torch.zeros_like(p) if gr is None else gr for (t, p), gr in zip(leaves.items(), grads)}


def _hvp(loss: Loss, params: Params, batch: Batch, v: Params) -> dict[str, torch.Tensor]:
    """``H v`` by double backward, attention on its math kernel (the fused CPU kernels have no second derivative)."""
    leaves = {t: p.detach().clone().requires_grad_(True) for t, p in params.items()}
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        value = loss(leaves, batch).mean()
    grads = torch.autograd.grad(value, list(leaves.values()), create_graph=True, allow_unused=True)
    inner = sum(((gr * v[t]).sum() for (t, gr) in zip(leaves, grads) if gr is not None),
                torch.zeros((), dtype=v[next(iter(v))].dtype))
    if not inner.requires_grad:
        return {t: torch.zeros_like(p) for t, p in params.items()}
    out = torch.autograd.grad(inner, list(leaves.values()), allow_unused=True)
    return {t: torch.zeros_like(p) if o is None else o for (t, p), o in zip(leaves.items(), out)}


def _split(batch: Batch) -> list[Batch]:
    x, y = batch
    return [(x[i:i + 1], y[i:i + 1]) for i in range(len(x))]


def _norm(tensors: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((t * t).sum()) for t in tensors.values()))


@dataclass(frozen=True)
class MirrorCertificate:
    """Measured errors of the mirror's consequences (all relative; zero up to round-off when they hold).

    ``invariance`` max over samples of ``|ℓ(Rθ) − ℓ(θ)|``; ``stationarity`` max over samples of ``‖Oᵀ∇ℓ‖ / ‖∇ℓ‖`` on
    the fixed set; ``gd`` and ``sgd`` the residual ``‖Oᵀθ‖`` after steps from the fixed set (every learning rate and
    weight decay in the grid); ``adam`` the same for Adam, which keeps the set when ``coordinate_compatible``;
    ``fisher`` ``‖J O‖ / ‖J‖``; ``commutation`` ``‖PHv − HPv‖ / ‖Hv‖`` for random ``v`` on the fixed set;
    ``symbolic`` whether the symbolic checks the group's claim rests on (its activations' identities
    ``σ(g z) = π(g) σ(z)``, which ``g`` satisfies as an element) are proved: True, False, or None where there are none
    (a linear site).
    """

    mirror: str
    invariance: float
    stationarity: float
    gd: float
    sgd: float
    adam: float
    coordinate_compatible: bool
    fisher: float
    commutation: float
    symbolic: bool | None = None

    def holds(self, tol: float = 1e-8) -> bool:
        """Every consequence holds (Adam only where the mirror is coordinate-compatible)."""
        if self.symbolic is False:
            return False
        errors = [self.invariance, self.stationarity, self.gd, self.sgd, self.fisher, self.commutation]
        return max(errors + ([self.adam] if self.coordinate_compatible else [])) <= tol


def certify(mirror: Mirror, loss: Loss, params: Params, batch: Batch, lrs: Sequence[float] = (1e-3, 0.1, 0.5),
            weight_decays: Sequence[float] = (0.0, 0.1), steps: int = 3) -> MirrorCertificate:
    """Measure the consequences of ``mirror`` (:class:`MirrorCertificate`) for ``loss`` on ``batch`` at ``params``
    (any point: the fixed-set checks start from its projection :meth:`Mirror.fixed_point`). Residuals are relative to
    ``‖θ‖``; where the fixed set repels (:func:`gd_stability`), round-off in ``im P`` grows by ``|1 − lr ξ|`` a step, so
    a large ``lr`` shows it."""
    params = {t: p.detach() for t, p in params.items()}
    samples = _split(batch)
    reflected = mirror.reflect(params)
    base = loss(params, batch)
    invariance = float((loss(reflected, batch) - base).abs().max() / base.abs().max().clamp_min(1e-300))
    fixed = mirror.fixed_point(params)
    grads = [_grad(loss, fixed, s) for s in samples]
    stationarity = max(float(mirror.residual(gr)) / max(_norm(gr), 1e-300) for gr in grads)
    names = list(params)
    G = torch.stack([_flat(gr, names) for gr in grads])                       # per-sample gradients
    C = torch.stack([torch.cat([c.reshape(-1) for c in mirror.coordinates(gr).values()]) for gr in grads])
    gram = G @ G.T     # ‖J O‖² = Σ (g_x·g_x')(c_x·c_x') and ‖J‖² = Σ (g_x·g_x')², J = E[g gᵀ], c = Oᵀg: n × n only
    fisher = math.sqrt(float((gram * (C @ C.T)).sum().clamp_min(0))) / max(float(gram.norm()), 1e-300)
    scale = max(_norm(fixed), 1e-300)

    def drift(step: Callable[[dict[str, torch.Tensor], int], dict[str, torch.Tensor]]) -> float:
        theta = dict(fixed)
        for t in range(steps):
            theta = step(theta, t)
        return float(mirror.residual(theta)) / max(_norm(theta), scale)

    gd = sgd = 0.0
    for lr in lrs:
        for gamma in weight_decays:
            def descend(theta: dict[str, torch.Tensor], t: int,
                        batch_: Batch | None = None) -> dict[str, torch.Tensor]:
                gr = _grad(loss, theta, batch if batch_ is None else batch_)
                return {n: theta[n] - lr * (gr[n] + 2 * gamma * theta[n]) for n in theta}
            gd = max(gd, drift(descend))
            sgd = max(sgd, drift(lambda theta, t: descend(theta, t, samples[t % len(samples)])))
    leaves = {t: p.clone().requires_grad_(True) for t, p in fixed.items()}
    optimizer = torch.optim.Adam(list(leaves.values()), lr=1e-2, weight_decay=1e-3)
    for t in range(steps):
        optimizer.zero_grad()
        loss(leaves, samples[t % len(samples)]).mean().backward()
        optimizer.step()
    adam = float(mirror.residual({t: p.detach() for t, p in leaves.items()})) / scale
    generator = torch.Generator().manual_seed(2)
    v = {t: torch.randn(p.shape, generator=generator, dtype=p.dtype) for t, p in fixed.items()}
    Hv = _hvp(loss, fixed, batch, v)
    PHv, HPv = mirror.project(Hv), _hvp(loss, fixed, batch, mirror.project(v))
    commutation = _norm({t: PHv[t] - HPv[t] for t in names}) / max(_norm(Hv), 1e-300)
    checks = mirror.symmetry.checks
    symbolic = all(c.proved is True for c in checks) if checks else None
    return MirrorCertificate(mirror.label, invariance, stationarity, gd, sgd, adam, mirror.coordinate_compatible,
                             fisher, commutation, symbolic)


# -- thresholds --------------------------------------------------------------------------------------------
def weight_decay_threshold(mirror: Mirror, loss: Loss, params: Params, batch: Batch) -> float:
    """``γ₀ = max(0, (L_0(θ − Pθ) − L_0(θ)) / ‖Pθ‖²)`` for ``L_γ = L_0 + γ‖θ‖²`` (``L_0`` the mean loss on ``batch``):
    for ``γ > γ₀`` the projection onto the fixed set lowers ``L_γ``, for ``γ < γ₀`` it raises it. (With the other
    common convention ``L_0 + (γ/2)‖θ‖²`` the threshold doubles.)"""
    projected = mirror.project(params)
    s2 = _norm(projected) ** 2
    if s2 == 0:
        raise ValueError(f"weight_decay_threshold: θ already satisfies {mirror.label}'s constraint (Pθ = 0)")
    fixed = mirror.fixed_point(params)
    return max(0.0, float(loss(fixed, batch).mean() - loss(params, batch).mean()) / s2)


def _restricted_hessians(mirror: Mirror, loss: Loss, params: Params, batches: Sequence[Batch],
                         max_rank: int = 512) -> torch.Tensor:
    """``OᵀH_b O`` for each batch ``b`` (``(B, k, k)``), ``O`` built column by column from ``V`` and the regions."""
    rank = mirror.rank()
    if rank > max_rank:
        raise ValueError(f"{mirror.label}: im P has dimension {rank} > {max_rank}; the restricted Hessian is dense")
    V = mirror.basis.to(**mirror._like(params))
    columns: list[dict[str, torch.Tensor]] = []
    for b in mirror.symmetry.moving_bindings():
        shape = b.unfold(params[b.tensor]).shape
        for i in range(V.shape[1]):
            for r in range(shape[1]):
                E = torch.zeros(shape, dtype=V.dtype, device=V.device)
                E[:, r] = V[:, i]
                col = {t: torch.zeros_like(p) for t, p in params.items()}
                col[b.tensor] = b.fold(col[b.tensor], E)
                columns.append(col)
    out = []
    for batch in batches:
        H = [mirror.coordinates(_hvp(loss, params, batch, c)) for c in columns]
        out.append(torch.stack([torch.cat([x.reshape(-1) for x in h.values()]) for h in H], 1))
    stacked = torch.stack(out)
    return (stacked + stacked.transpose(1, 2)) / 2


@dataclass(frozen=True)
class GDStability:
    """The spectrum ``ξ`` of ``PHP`` on ``im P`` at a point of the fixed set and what it implies for GD with learning
    rate ``lr`` and weight decay ``γ`` (``L_γ = L_0 + γ‖θ‖²``: the eigenvalues move by ``2γ``).

    The fixed set attracts GD iff ``0 < lr (ξ_i + 2γ) < 2`` for every ``i``: ``critical_weight_decay = −min ξ / 2`` is
    the smallest ``γ`` making it attractive (the *most negative* eigenvalue decides), ``max_lr = 2 / (max ξ + 2γ)``."""

    eigenvalues: torch.Tensor
    weight_decay: float
    lr: float

    @property
    def critical_weight_decay(self) -> float:
        return max(0.0, -float(self.eigenvalues.min()) / 2)

    @property
    def max_lr(self) -> float:
        return 2 / float(self.eigenvalues.max() + 2 * self.weight_decay)

    @property
    def attracting(self) -> bool:
        a = self.lr * (self.eigenvalues + 2 * self.weight_decay)
        return bool(((a > 0) & (a < 2)).all())


def gd_stability(mirror: Mirror, loss: Loss, params: Params, batch: Batch, lr: float,
                 weight_decay: float = 0.0) -> GDStability:
    """:class:`GDStability` at the projection of ``params`` onto the fixed set."""
    H = _restricted_hessians(mirror, loss, mirror.fixed_point(params), [batch])[0]
    return GDStability(torch.linalg.eigvalsh(H), weight_decay, lr)


@dataclass(frozen=True)
class Lyapunov:
    """The SGD collapse criterion on ``im P`` (batch size 1): ``z_{t+1} = (I − lr (H_x + 2γ)) z_t``, ``H_x = OᵀH(x)O``.

    ``exponent`` the top Lyapunov exponent of the random product (``< 0``: the fixed set attracts SGD in probability),
    estimated over ``steps`` draws with renormalisation; ``commuting`` the exponents ``E_x log|1 − lr(ξ_i(x) + 2γ)|``
    of the commutation approximation (``ξ_i(x)`` the diagonal of ``H_x`` in the eigenbasis of a random combination
    ``Σ r_x H_x``: almost surely the basis all ``H_x`` share when they commute), whose maximum
    is exact when the ``H_x`` commute; ``second_order`` the learning rate above which the paper's second-order rule
    ``lr > −2E[a]/E[a²]`` (``a = ξ + 2γ``, per direction, maximised) predicts collapse: right only while
    ``lr |a| ≪ 1``."""

    exponent: float
    commuting: torch.Tensor
    second_order: float


def lyapunov(mirror: Mirror, loss: Loss, params: Params, batch: Batch, lr: float, weight_decay: float = 0.0,
             steps: int = 20000, generator: torch.Generator | None = None) -> Lyapunov:
    """:class:`Lyapunov` at the projection of ``params`` onto the fixed set, samples of ``batch`` drawn uniformly."""
    H = _restricted_hessians(mirror, loss, mirror.fixed_point(params), _split(batch))
    k = H.shape[1]
    A = torch.eye(k, dtype=H.dtype) - lr * (H + 2 * weight_decay * torch.eye(k, dtype=H.dtype))
    generator = generator if generator is not None else torch.Generator().manual_seed(3)
    draws = torch.randint(0, len(H), (steps,), generator=generator)
    z = torch.randn(k, generator=generator, dtype=H.dtype)
    total = 0.0
    for i in draws.tolist():
        z = A[i] @ z
        n = float(z.norm())
        total += math.log(n)
        z = z / n
    weights = torch.randn(len(H), generator=generator, dtype=H.dtype)
    _, Q = torch.linalg.eigh(torch.einsum("x,xij->ij", weights, H))   # the common eigenbasis when the H_x commute
    xi = torch.diagonal(Q.T @ H @ Q, dim1=1, dim2=2) + 2 * weight_decay
    commuting = torch.log((1 - lr * xi).abs()).mean(0)
    mean, second = xi.mean(0), (xi * xi).mean(0)
    rule = float((-2 * mean / second).max())
    return Lyapunov(total / steps, commuting, rule)
