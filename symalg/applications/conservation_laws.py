"""Completeness of conservation laws: how many functionally independent quantities gradient flow conserves.

Following Marcotte, Gribonval and Peyré ("Abide by the law and follow the flow", NeurIPS 2023, [Marcotte2023]), for a
dense chain ``F_θ(x) = W_q σ(⋯ σ(W_1 x + b_1) ⋯) + b_q`` with identity (linear) or ReLU-type sites, on a
region where the activation pattern of every sample is fixed,

    ⟨r, F_θ(x)⟩ = Φ_c(θ) = c_qᵀ (W_q D_{q-1}(⋯ D_1(W_1 c_0 + s b_1) ⋯) + s b_q),    D_k = diag(c_k),

with ``c_0 = x``, ``c_q = r``, ``s = 1``, ``c_k`` the 0/1 pattern at a ReLU site and ``c_k = 1`` at an
identity site. ``Φ_c`` is linear in the lifting ``φ(θ)`` (products of weights along input–output and
bias–output paths; at identity sites they merge into the end-to-end matrix and bias), so every loss
gradient lies in ``W(θ) = span_c ∇Φ_c(θ) = span_i ∇φ_i(θ)``. A function ``h`` is conserved by the
gradient flow of every such loss iff ``∇h ⊥ W`` everywhere, iff ``∇h ⊥ Lie(W)`` (the fields generated
under ``[X, Y] = DY·X − DX·Y``), so near a generic ``θ`` there are ``D − dim Lie(W)(θ)`` independent laws.

Computation at a point, without ever forming a field symbolically:

* Filtration ``F_1 = W``, ``F_{j+1} = F_j + [F_j, F_j]`` (brackets nested at most ``j − 1`` deep). If
  ``F_{j+1}(θ) = F_j(θ)`` at a generic θ, the distribution ``F_j`` is involutive near θ and contains ``W``,
  so it is the trace ``Lie(W)(θ)``.
* Level ``j + 1`` is sampled as ``[R', R''](θ)`` with ``R', R''`` random elements of ``F_j``
  (``R = a R_1 + [R_1, R_2]`` recursively, generators ``∇Φ_c`` with Gaussian ``c``). The samples are
  polynomial in the random coefficients, so ``N`` of them span ``min(N, dim)`` of what the level adds,
  almost surely: a batch that adds fewer directions than it has samples has found them all.
* A bracket is evaluated exactly by forward-mode Taylor arithmetic on hyper-dual numbers (``ε_i² = 0``,
  components indexed by subsets of the ``ε_i``): ``[X, Y](θ) = ∂_ε Y(θ + εX(θ)) − ∂_ε X(θ + εY(θ))``,
  one infinitesimal per nesting, with ``∇Φ_c`` as one forward and one backward pass.
* Ranks are singular values of the samples, scaled to norm at most 1 with rounding at most
  ``ε / CANCELLATION`` (see :func:`_evaluate`), with tolerance ``rtol``; new samples are judged against all
  earlier ones weighted by their singular values (see :class:`_Span`); the smallest kept and largest dropped
  singular values are reported.

Every symmetry-derived quantity ``Q_M`` has ``∇Q_M = 2 M·θ ⊥ Lie(W)(θ)``, so ``D − dim Lie(W)(θ)`` is at
least symalg's count of independent quantities; :func:`compare_with_symmetries` says whether it is more.

>>> laws = count_conservation_laws([3, 4, 2], activation="linear")
>>> laws.n_params, laws.dim_fields, laws.dim_lie, laws.n_laws, laws.height
(20, 6, 10, 10, 1)
>>> compare_with_symmetries([3, 4, 2], activation="relu", bias=True).statement
'complete'
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

import torch

from symalg.symbolic.derive import Analysis, derive
from symalg.frontend.spec import parse
from symalg.errors import SpecError
from symalg.ir.architecture import Architecture
from symalg.numeric.orbit_rank import action_matrix

__all__ = ["ConservationLaws", "Completeness", "count_conservation_laws", "compare_with_symmetries", "random_point"]

IDENTITY_SITES = ("identity",)
PATH_SITES = ("relu", "leaky_relu")
_SAMPLE_SEED = 2 ** 32
CANCELLATION = 1e-2   # brackets are scaled up by at most 1 / CANCELLATION: rounding stays below ~1e-13
_ACTIVATIONS = {"linear": "identity", "identity": "identity", "relu": "relu"}


ChainModel = Union[Sequence[int], Architecture, Analysis, str]
"""What names a dense chain: its widths ``(n_0, …, n_q)``, an architecture, an analysis or a spec string."""


@dataclass(frozen=True)
class _Chain:
    """A dense chain as the computation sees it: ``widths = (n_0, …, n_q)``, ``bias[k]`` for layer
    ``k + 1``, ``path[k]`` whether hidden site ``k + 1`` is ReLU-type, parameter ``names`` in the flat order
    (each weight, then its bias)."""

    widths: tuple[int, ...]
    bias: tuple[bool, ...]
    path: tuple[bool, ...]
    names: tuple[str, ...]

    @classmethod
    def of(cls, arch: Architecture) -> "_Chain":
        if arch.widths:
            raise SpecError(f"count_conservation_laws: widths {sorted(map(str, arch.widths))} are symbolic; "
                            "use arch.subs(...)")
        widths: list[int] = []
        bias: list[bool] = []
        path: list[bool] = []
        names: list[str] = []
        for name in arch.layer_names:
            node = arch.node(name)
            if node["kind"] == "linear":
                widths = widths or [int(node["in_features"])]
                widths.append(int(node["out_features"]))
                bias.append(bool(node["bias"]))
                names += [node["weight"]] + ([node["bias"]] if node["bias"] else [])
            elif node["op"] in IDENTITY_SITES + PATH_SITES:   # leaky_relu(slope=1) is the identity
                path.append(node["op"] in PATH_SITES and (node.get("params") or {}).get("slope", 0) != 1)
            else:
                raise SpecError(f"count_conservation_laws: activation {node['op']!r} at node {name!r} has no "
                                f"path lifting; supported: {IDENTITY_SITES + PATH_SITES}")
        return cls(tuple(widths), tuple(bias), tuple(path), tuple(names))

    @property
    def depth(self) -> int:
        return len(self.widths) - 1

    @functools.cached_property
    def slices(self) -> list[tuple[slice, tuple[int, int], slice | None]]:
        """Per layer: the flat slice of the weight, its shape, the flat slice of the bias (or ``None``)."""
        out, offset = [], 0
        for k in range(self.depth):
            o, i = self.widths[k + 1], self.widths[k]
            weight, offset = slice(offset, offset + o * i), offset + o * i
            bias, offset = (slice(offset, offset + o), offset + o) if self.bias[k] else (None, offset)
            out.append((weight, (o, i), bias))
        return out

    @property
    def n_coordinates(self) -> int:
        """Number of coordinates of the lifting ``φ``: distinct monomials of ``Φ_c`` in ``c`` and ``s``
        (input paths, plus bias paths grouped by the ReLU sites they cross)."""
        n, q = self.widths, self.depth
        crossed = lambda k: tuple(j for j in range(k, q) if self.path[j - 1])  # noqa: E731  sites k..q-1
        bias_paths = {crossed(k + 1) for k in range(q) if self.bias[k]}
        return sum(n[q] * math.prod(n[j] for j in sites) for sites in bias_paths) + \
            n[0] * n[q] * math.prod(n[j] for j in crossed(1))


# ---------------------------------------------------------------------------------------------
# hyper-dual arithmetic: leading axis = components indexed by subsets of ε_1..ε_m (bit masks);
# a leading axis of size 1 is a constant (no ε part).
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _subset_pairs(m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(S, T, S \\ T)`` for every subset ``S`` of ``m`` infinitesimals and every ``T ⊆ S`` (``3^m`` pairs)."""
    s_list, t_list = [], []
    for s in range(2 ** m):
        t = s
        while True:
            s_list.append(s)
            t_list.append(t)
            if t == 0:
                break
            t = (t - 1) & s
    s_idx, t_idx = torch.tensor(s_list), torch.tensor(t_list)
    return s_idx, t_idx, s_idx ^ t_idx


def _product(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], a: torch.Tensor,
             b: torch.Tensor) -> torch.Tensor:
    """``op(a, b)`` for a bilinear ``op`` on hyper-dual tensors: ``(ab)_S = Σ_{T ⊆ S} op(a_T, b_{S∖T})``."""
    if a.shape[0] == 1 or b.shape[0] == 1:
        return op(a, b)
    s_idx, t_idx, u_idx = _subset_pairs(a.shape[0].bit_length() - 1)
    terms = op(a.index_select(0, t_idx), b.index_select(0, u_idx))
    return terms.new_zeros((a.shape[0],) + terms.shape[1:]).index_add_(0, s_idx, terms)


def _matvec(w: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return (w @ z.unsqueeze(-1)).squeeze(-1)


def _rmatvec(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (d.unsqueeze(-2) @ w).squeeze(-2)


def _outer(d: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return d.unsqueeze(-1) * z.unsqueeze(-2)


def _promote(x: torch.Tensor, components: int) -> torch.Tensor:
    """A constant as a hyper-dual tensor with ``components`` components (zero ε parts)."""
    if x.shape[0] == components:
        return x
    return torch.cat([x, x.new_zeros((components - 1,) + x.shape[1:])])


def _field(chain: _Chain, coefficients: _Coefficients, theta: torch.Tensor) -> torch.Tensor:
    """``∇_θ Φ_c(θ)`` at hyper-dual ``theta`` (``components × N × D``), for ``N`` coefficient sets at once.

    ``coefficients = (c, s)``: ``c[k]`` of shape ``(1, N, n_k)``, ``None`` at identity sites; ``s`` of
    shape ``(1, N, 1)`` (``None`` without biases). Forward ``z_k = c_k ⊙ (W_k z_{k-1} + s b_k)``,
    backward ``δ_{k-1} = c_{k-1} ⊙ W_kᵀ δ_k``; ``∂Φ/∂W_k = δ_k z_{k-1}ᵀ``, ``∂Φ/∂b_k = s δ_k``.
    """
    c, s = coefficients
    first, last = c[0], c[-1]
    if first is None or last is None or (s is None and any(chain.bias)):
        raise ValueError("_field: the coefficients of the input and output sites (and s, with biases) must be drawn")
    layers = [(theta[..., w].unflatten(-1, shape), None if b is None else theta[..., b])
              for w, shape, b in chain.slices]
    z = [first]
    for k, (weight, bias) in enumerate(layers[:-1]):
        y = _product(_matvec, weight, z[-1]) + (0 if bias is None or s is None else s * bias)
        site = c[k + 1]
        z.append(y if site is None else site * y)
    delta = last
    grads: list[list[torch.Tensor]] = []
    for k in reversed(range(chain.depth)):
        weight, bias = layers[k]
        grads.append([_product(_outer, delta, z[k]).flatten(-2)] + ([] if bias is None or s is None else [s * delta]))
        if k:
            delta = _product(_rmatvec, delta, weight)
            site = c[k]
            delta = delta if site is None else site * delta
    return torch.cat([_promote(g, theta.shape[0]) for layer in reversed(grads) for g in layer], -1)


def _sample(chain: _Chain, n: int, generator: torch.Generator, dtype: torch.dtype) -> _Coefficients:
    """``n`` random coefficient sets ``(c, s)`` of gradient fields ``∇Φ_c``: Gaussian at the ends and at
    ReLU sites, ``None`` (ones) at identity sites; ``s`` Gaussian when any layer has a bias."""
    def gaussian(width: int) -> torch.Tensor:
        return torch.randn(1, n, width, generator=generator, dtype=dtype)

    c = [gaussian(w) if k in (0, chain.depth) or chain.path[k - 1] else None for k, w in enumerate(chain.widths)]
    return c, gaussian(1) if any(chain.bias) else None


_Coefficients = tuple[list[torch.Tensor | None], torch.Tensor | None]
"""A coefficient set ``(c, s)`` of gradient fields (:func:`_sample`)."""


@dataclass(frozen=True)
class _Bracket:
    """``n`` random fields ``weight ⊙ R' + [R', R'']`` (``weight = None``: the bracket alone), with
    ``R'`` and ``R''`` drawn together as one batch of ``2n`` (``inner``: a coefficient set or a ``_Bracket``)."""

    inner: _Fields
    weight: torch.Tensor | None


_Fields = Union[_Coefficients, _Bracket]
"""Random fields: a coefficient set (generators) or a :class:`_Bracket` of fields."""


def _draw(chain: _Chain, level: int, n: int, generator: torch.Generator, dtype: torch.dtype,
          bracket_only: bool = False) -> _Fields:
    """``n`` random fields spanning ``F_level`` (``F_1 = W``, ``F_{j+1} = F_j + [F_j, F_j]``), or only
    ``[F_{level-1}, F_{level-1}]`` when ``bracket_only``."""
    if level == 1:
        return _sample(chain, n, generator, dtype)
    inner = _draw(chain, level - 1, 2 * n, generator, dtype)
    return _Bracket(inner, None if bracket_only else torch.randn(1, n, 1, generator=generator, dtype=dtype))


def _unit(fields: torch.Tensor, floor: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Hyper-dual fields divided by a constant: the norm of their values at θ (component 0), but at
    least ``floor``."""
    norm = torch.maximum(fields[:1].norm(dim=-1, keepdim=True), torch.as_tensor(floor, dtype=fields.dtype))
    return fields / norm.clamp_min(torch.finfo(fields.dtype).tiny)


def _evaluate(chain: _Chain, fields: _Fields, theta: torch.Tensor) -> torch.Tensor:
    """Values of ``fields`` (from :func:`_draw`) at hyper-dual ``theta`` (``components × n × D``).

    ``[X, Y](θ) = ∂_ε Y(θ + εX(θ)) − ∂_ε X(θ + εY(θ))`` with a fresh infinitesimal ``ε``; ``R'`` and ``R''``
    are evaluated as one batch, so a field of height ``h`` costs ``2^h`` batched gradient evaluations.

    Every field is divided by a constant (spans are unchanged): generators and brackets by their norm
    at θ, so that the two terms of ``a R' + [R', R'']`` stay comparable (unscaled, brackets grow by
    orders of magnitude per level and swamp the lower terms in float64); but a bracket by at least
    ``CANCELLATION`` times the norms of its two terms, so that one that cancels to rounding error (an
    identically zero bracket) stays at ``ε / CANCELLATION`` instead of looking like a direction.
    """
    if not isinstance(fields, _Bracket):
        return _unit(_field(chain, fields, theta))
    m, n = theta.shape[0], theta.shape[1]
    pair = torch.cat([theta, theta], 1)
    values = _evaluate(chain, fields.inner, pair)                                  # R'(θ), R''(θ)
    slopes = _evaluate(chain, fields.inner, torch.cat([pair, values.roll(n, 1)]))[m:]  # DR'[R''], DR''[R']
    terms = slopes[:1].norm(dim=-1, keepdim=True)
    bracket = _unit(slopes[:, n:] - slopes[:, :n], CANCELLATION * (terms[:, :n] + terms[:, n:]))
    return bracket if fields.weight is None else bracket + fields.weight * values[:, :n]


class _Span:
    """The span of the samples so far (norm at most 1), kept as their singular values ``σ`` (above ``rtol``) and
    right singular vectors ``q`` (orthonormal rows): ``B = diag(σ) q`` has the samples' Gram matrix.

    New samples ``V`` are judged by the singular values they add to ``[B; V]``, never by their distance
    from ``q`` alone: a direction that the samples reach only weakly (small ``σ``) is known only to about
    ``ε/σ``, and a plain projection would report that error as a new direction; weighted by ``σ`` it costs
    only ``ε``. :meth:`extend` recomputes ``σ`` and ``q`` from ``[B; V]``, so the two stay consistent.
    """

    def __init__(self, d: int, rtol: float, dtype: torch.dtype):
        self.rtol = rtol
        self.q = torch.zeros(0, d, dtype=dtype)
        self.sigma = torch.zeros(0, dtype=dtype)

    @property
    def rank(self) -> int:
        return self.q.shape[0]

    def excess(self, rows: torch.Tensor) -> torch.Tensor:
        """Singular values of ``(I + C Σ⁻² Cᵀ)^{-1/2} E``, ``C`` and ``E`` the parts of ``rows`` in and off
        the span: what ``rows`` add to ``[B; V]`` (the Schur complement of ``B``)."""
        inside = rows @ self.q.T
        weighted = inside / self.sigma
        gram = torch.eye(len(rows), dtype=rows.dtype) + weighted @ weighted.T
        outside = torch.linalg.solve_triangular(torch.linalg.cholesky(gram), rows - inside @ self.q, upper=False)
        return torch.linalg.svdvals(outside)

    def extend(self, rows: torch.Tensor) -> torch.Tensor:
        """Add ``rows``; return all singular values of ``[B; V]`` (the kept ones are ``> rtol``)."""
        _, sigma, vh = torch.linalg.svd(torch.cat([self.sigma[:, None] * self.q, rows]), full_matrices=False)
        rank = int((sigma > self.rtol).sum())
        self.sigma, self.q = sigma[:rank], vh[:rank]
        return sigma


@dataclass(frozen=True, eq=False)
class ConservationLaws:
    """Result of :func:`count_conservation_laws` at one parameter point.

    Attributes
    ----------
    architecture, params : the chain and the point ``θ`` (``{name: tensor}``, float64).
    ranks : ``dim F_j(θ)`` for ``j = 1, 2, …``: ``F_1 = W``, ``F_{j+1} = F_j + [F_j, F_j]`` (brackets nested
        at most ``j − 1`` deep).
    stopped : why the search ended: ``"stagnated"`` (a level added nothing: ``F_j`` is the trace),
        ``"full"`` (rank ``D``), ``"bound"`` (reached ``D − known_laws``: the known laws are all there
        are), or ``"max_level"`` (undecided; ``n_laws`` is an upper bound).
    basis : orthonormal basis (rows, ``dim_lie × D``) of the trace found, in the order of ``params``.
    sigma_kept, sigma_dropped : smallest singular value counted as a direction and largest one
        dropped (``0.0`` when none was); see :attr:`gap`.
    samples : number of bracket evaluations.
    """

    architecture: Architecture
    params: dict[str, torch.Tensor]
    ranks: tuple[int, ...]
    stopped: str
    basis: torch.Tensor
    sigma_kept: float
    sigma_dropped: float
    samples: int

    @property
    def n_params(self) -> int:
        return self.basis.shape[1]

    @property
    def stabilised(self) -> bool:
        return self.stopped != "max_level"

    @property
    def dim_fields(self) -> int:
        """``dim W(θ)``: the span of the gradient fields themselves."""
        return self.ranks[0]

    @property
    def dim_lie(self) -> int:
        """``dim Lie(W)(θ)`` (a lower bound when not :attr:`stabilised`)."""
        return self.ranks[-1]

    @property
    def n_laws(self) -> int:
        """``D − dim Lie(W)(θ)``: functionally independent conservation laws near θ."""
        return self.n_params - self.dim_lie

    @property
    def height(self) -> int:
        """Bracket nesting needed: the smallest ``h`` with ``F_{h+1}(θ)`` the whole trace found
        (0: ``W(θ)`` itself; brackets of height ``h`` have up to ``2^h`` gradient fields)."""
        return self.ranks.index(self.dim_lie)

    @property
    def gap(self) -> float:
        """``sigma_kept / sigma_dropped``: how clearly the ranks were decided."""
        return self.sigma_kept / self.sigma_dropped if self.sigma_dropped else math.inf

    def __str__(self) -> str:
        return (f"{self.architecture}: D = {self.n_params}, dim W = {self.dim_fields}, dim Lie(W) = {self.dim_lie} "
                f"(brackets of height {self.height}; {self.stopped}), {self.n_laws} conservation laws; "
                f"singular-value gap {self.gap:.1e}")


@dataclass(frozen=True, eq=False)
class Completeness:
    """Conservation laws against symalg's functionally independent symmetry-derived quantities.

    ``orthogonality`` is ``max |⟨M·θ, v⟩| / ‖M·θ‖`` over symmetric generators ``M`` and unit vectors ``v`` of
    the trace found: Noether's ``∇Q_M = 2 M·θ ⊥ Lie(W)(θ)``, checked (it fails if a claimed quantity is not
    conserved). A basis direction found with singular value ``σ`` is accurate to about ``ε/σ``, so this is
    ``~1e-15`` to ``1e-9`` when all is well; ``ORTHOGONALITY_TOL`` bounds it for a ``'complete'`` statement.
    """

    laws: ConservationLaws
    symmetry_count: int
    orthogonality: float

    ORTHOGONALITY_TOL = 1e-6

    @property
    def extra(self) -> int:
        """Laws beyond the symmetry-derived quantities (negative only if something is wrong)."""
        return self.laws.n_laws - self.symmetry_count

    @property
    def complete(self) -> bool:
        return self.statement == "complete"

    @property
    def statement(self) -> str:
        """``'complete'``, ``'incomplete: k extra laws beyond symalg's quantities'``, or why neither."""
        if self.orthogonality > self.ORTHOGONALITY_TOL:
            return (f"inconsistent: symmetry-derived gradients are not orthogonal to the trace "
                    f"(|cos| up to {self.orthogonality:.1e}): a claimed quantity is not conserved")
        if self.extra < 0:
            return (f"inconsistent: {self.symmetry_count} independent symmetry-derived quantities but only "
                    f"{self.laws.n_laws} laws")
        if not self.laws.stabilised:
            return (f"undetermined: the trace did not stabilise within {len(self.laws.ranks)} levels "
                    f"(at most {self.laws.n_laws} laws, {self.symmetry_count} from symmetries)")
        if self.extra > 0:
            return f"incomplete: {self.extra} extra laws beyond symalg's quantities"
        return "complete"

    def __str__(self) -> str:
        return (f"{self.laws.architecture}: {self.statement} ({self.laws.n_laws} laws, {self.symmetry_count} "
                "from symmetries)")


def random_point(arch: Architecture, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """A generic, well-conditioned point: ``W_k = U diag(s) Vᵀ`` with Haar ``U``, ``V`` and singular values
    ``s ~ U[1, 2]``; biases ``N(0, 1)`` (float64).

    The distribution has a density on an open set, so generic ranks hold almost surely. Deep brackets act
    like Krylov sequences in products of the weights: the new directions they add are scaled by powers of
    the weights' condition numbers, which Gaussian weights (condition numbers in the tens) make invisible
    in float64 after a few levels.
    """
    params = {}
    for name, shape in arch.parameter_shapes.items():
        shape = tuple(int(n) for n in shape)
        if len(shape) == 1:
            params[name] = torch.randn(shape, generator=generator, dtype=torch.float64)
            continue
        o, i = shape
        u = torch.linalg.qr(torch.randn(o, o, generator=generator, dtype=torch.float64)).Q[:, :min(o, i)]
        v = torch.linalg.qr(torch.randn(i, i, generator=generator, dtype=torch.float64)).Q[:, :min(o, i)]
        s = 1 + torch.rand(min(o, i), generator=generator, dtype=torch.float64)
        params[name] = (u * s) @ v.T
    return params


def _architecture(model: ChainModel, activation: str | None, bias: bool | None) -> Architecture:
    """The dense chain of ``model``: widths, a spec, or an :class:`~symalg.Analysis` of either front end (a traced
    model must be an ``nn.Sequential`` of linear layers and activations; anything else is refused by name)."""
    if isinstance(model, (Analysis, Architecture, str)):
        if activation is not None or bias is not None:
            raise SpecError("count_conservation_laws: activation= and bias= apply to a widths sequence; "
                            f"a {type(model).__name__} carries its own")
        if not isinstance(model, Analysis):
            return parse(model)
        source, module = model.model_graph.source, model.model_graph.model
        if isinstance(source, Architecture):
            return source
        try:
            return parse(module)   # a chain nn.Sequential reads back as the spec it spells
        except SpecError:
            raise SpecError(f"count_conservation_laws: model is an Analysis of a traced "
                            f"{type(module).__name__ if module is not None else 'graph'}, not of a dense chain; the "
                            "path lifting needs an nn.Sequential of Linear layers and identity / ReLU / leaky-ReLU "
                            "activations (or a spec of one)") from None
    widths = list(model) if isinstance(model, Sequence) else None
    if not widths or len(widths) < 2 or not all(isinstance(w, int) and w > 0 for w in widths):
        raise SpecError(f"count_conservation_laws: model must be widths (n_0, …, n_q) of positive ints, at least two, "
                        f"or an Architecture / Analysis / spec string; got {model!r}")
    activation = "linear" if activation is None else activation
    if activation not in _ACTIVATIONS:
        raise SpecError(f"count_conservation_laws: activation={activation!r}; expected one of {sorted(_ACTIVATIONS)}")
    options = "" if bias else ", bias=False"
    layers = [f"linear({a}, {b}{options})" for a, b in zip(widths, widths[1:])]
    return parse(f" -> {_ACTIVATIONS[activation]} -> ".join(layers))


def count_conservation_laws(model: ChainModel, activation: str | None = None, bias: bool | None = None, *,
                            params: Mapping[str, torch.Tensor] | None = None, known_laws: int | None = None,
                            seed: int = 0, max_level: int = 7, rtol: float = 1e-11) -> ConservationLaws:
    """Number of independent conservation laws of gradient flow near ``params``: ``D − dim Lie(W)(θ)``.

    Parameters
    ----------
    model : widths ``(n_0, …, n_q)`` (``q`` layers), or an :class:`~symalg.Architecture`, a spec string or an
        :class:`~symalg.Analysis` (of a spec, or of a traced ``nn.Sequential``) of a dense chain with identity /
        ReLU / leaky-ReLU sites.
    activation : ``"linear"`` (default) or ``"relu"`` for every hidden site of a widths sequence.
    bias : whether every layer of a widths sequence has a bias (default ``False``).
    params : the point θ (``{name: tensor}`` as in ``nn.Sequential``); default :func:`random_point` (``seed``).
    known_laws : number of independent laws already known at θ (e.g. symalg's). Their gradients are
        orthogonal to ``Lie(W)(θ)``, so once the trace reaches ``D − known_laws`` the search stops
        (``stopped == "bound"``): the count is then proven without the costlier stagnation level. A
        trace that outgrows the bound refutes it, and the search goes on to stagnation.
    seed : seeds θ (unless given) and, separately, the bracket samples.
    max_level : last level ``F_j`` tried; ``1`` counts only ``W(θ)`` (no brackets).
    rtol : singular values of the samples (scaled to norm at most 1) below ``rtol`` count as zero.

    Examples
    --------
    >>> count_conservation_laws([4, 3, 2], activation="relu", bias=False).n_laws   # one per hidden neuron
    3
    """
    if max_level < 1:
        raise ValueError(f"count_conservation_laws: max_level must be at least 1, got {max_level}")
    arch = _architecture(model, activation, bias)
    chain = _Chain.of(arch)
    if params is None:
        params = random_point(arch, torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(_SAMPLE_SEED + seed)   # independent of θ drawn with ``seed``
    arch.widths_from_params(params)
    params = {name: params[name].detach().to("cpu", torch.float64) for name in chain.names}
    theta = torch.cat([params[name].reshape(-1) for name in chain.names])
    d = theta.numel()
    if known_laws is not None and not 0 <= known_laws <= d:
        raise ValueError(f"count_conservation_laws: known_laws must be between 0 and D = {d}, got {known_laws}")
    target = d if known_laws is None else d - known_laws
    span, dropped, samples, stopped = _Span(d, rtol, theta.dtype), 0.0, 0, "max_level"
    ranks: list[int] = []

    def samples_at(level: int, n: int) -> torch.Tensor:
        fields = _draw(chain, level, n, generator, theta.dtype, bracket_only=True)
        return _evaluate(chain, fields, theta.expand(1, n, d))[0]

    for level in range(1, max_level + 1):
        before = span.rank
        # more samples than new directions: then (a.s.) they span everything this level adds. The batch
        # sizes only set the cost: a first guess (two samples, or as many as the last level added when
        # a bound is known, at most what is left), then doubling.
        if level == 1:
            guess = min(d, chain.n_coordinates)
        else:
            guess = min(target - before, ranks[-1] - ranks[-2] if level > 2 and known_laws is not None else 1)
        rows = samples_at(level, guess + 1)
        while level > 1:
            excess = span.excess(rows)
            new = int((excess > rtol).sum())
            dropped = max(dropped, float(excess[new])) if new < len(excess) else dropped
            if new < len(rows) or before + new >= target:
                break
            rows = torch.cat([rows, samples_at(level, min(len(rows), d - before - new + 1))])
        samples += len(rows)
        if level == 1 or new:
            sigma = span.extend(rows)
            dropped = max(dropped, float(sigma[span.rank])) if span.rank < len(sigma) else dropped
        ranks.append(span.rank)
        if span.rank > target:   # more directions than the known laws allow: they are not all laws
            target = d
        if span.rank == before:
            stopped = "stagnated"
        elif span.rank == d:
            stopped = "full"
        elif span.rank == target:
            stopped = "bound"
        if stopped != "max_level":
            break
    kept = float(span.sigma[-1]) if span.rank else math.inf
    return ConservationLaws(arch, params, tuple(ranks), stopped, span.q, kept, dropped, samples)


def compare_with_symmetries(model: ChainModel, activation: str | None = None, bias: bool | None = None, *,
                            params: Mapping[str, torch.Tensor] | None = None, seed: int = 0, certify: bool = True,
                            **options: Any) -> Completeness:
    """:func:`count_conservation_laws` against symalg's count of functionally independent conserved
    quantities (``Analysis.independent_conserved(params)``, the rank of ``M ↦ M·θ`` on symmetric ``M``)
    at the same point. With ``certify`` that count is passed as ``known_laws`` (the search stops once the
    trace reaches ``D −`` it, which proves completeness; if the quantities are incomplete it is never
    reached and the search runs to stagnation). ``options`` go to :func:`count_conservation_laws`.

    >>> str(compare_with_symmetries([2, 5, 2], activation="linear", bias=False))  # doctest: +NORMALIZE_WHITESPACE
    "Architecture('linear(2, 5, bias=False) -> identity -> linear(5, 2, bias=False)'): complete
    (14 laws, 14 from symmetries)"
    """
    arch = _architecture(model, activation, bias)
    analysis = model if isinstance(model, Analysis) else derive(arch)
    if params is None:
        params = random_point(arch, torch.Generator().manual_seed(seed))
    params = {name: tensor.detach().to("cpu", torch.float64) for name, tensor in params.items()}
    count = int(analysis.independent_conserved(params))
    laws = count_conservation_laws(arch, params=params, seed=seed, known_laws=count if certify else None, **options)
    gradients = action_matrix(analysis, laws.params, symmetric=True)
    gradients = gradients[gradients.norm(dim=1) > 0]
    cosines = (gradients @ laws.basis.T).norm(dim=1) / gradients.norm(dim=1)
    return Completeness(laws, count, float(cosines.max()) if len(cosines) else 0.0)
