"""The first-order null space of a model at one parameter point and given data points.

:func:`symalg.discover` finds *vector fields* ``θ ↦ Aθ + c`` that leave a model invariant at every ``θ``
(:attr:`~symalg.discovery.exact.Discovery.dimension` counts those fields, a Lie algebra). A different and cheaper
object is what the papers' Theorem 6.3.1 ([Zhao2026], [Zhao2024] Thm. 3.1) constrains at one point: the directions
``v ∈ R^P`` with

    ⟨∇_θ ℓ_i(θ), v⟩ = 0   for every data point i        (target="loss": per-sample losses)
    J_f(θ, X) v = 0                                       (target="function": every output on X)

— the null space of the ``d × P`` per-sample gradient matrix (or the Jacobian of the outputs). It contains the
tangent ``M·θ`` of every symmetry of the loss on these data; with few data points it is much larger (at most ``d``
constraints). :func:`null_space_at` reports its dimension with a certified rank, the derived symmetries' tangent at
``θ`` and how the two meet: ``explained = dim(N ∩ T)``, ``new = dim N − explained`` (directions the derived
symmetries do not span: data-dependent ones, or a first-order artefact), ``unconfirmed = dim T − explained``
(derived tangent directions outside ``N``: a false claim, or a ``θ`` where the model is not differentiable).

>>> import torch, symalg
>>> from symalg.discovery.pointwise import null_space_at
>>> x = torch.randn(1, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
>>> report = null_space_at("linear(2, 3, bias=False) -> tanh -> linear(3, 1, bias=False)", x)
>>> report.parameters, report.dimension, report.derived, report.new      # one data point: 9 − 1 directions
(9, 8, 0, 8)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from symalg.discovery.exact import ParameterLayout, _analysis, _Problem, _rank
from symalg.errors import SpecError
from symalg.numeric.orbit_rank import RankDecision, action_matrix, certified_rank

__all__ = ["PointNullSpace", "null_space_at"]


@dataclass(frozen=True)
class PointNullSpace:
    """The first-order null space at one point (module docstring).

    Attributes
    ----------
    model, target : the model's name; ``"loss"`` or ``"function"``; ``parameters`` is ``P`` and ``constraints``
        the rows (data points, or outputs on the data).
    rank : the certified :class:`~symalg.numeric.orbit_rank.RankDecision` of the constraint matrix.
    derived : the rank of the derived symmetries' tangent ``{M·θ}`` at this ``θ``; ``joint`` the rank of the null
        space and that tangent together.
    basis : an orthonormal basis of the null space, ``(dimension, P)``, in the order of ``named_parameters``.
    """

    model: str
    target: str
    parameters: int
    constraints: int
    rank: RankDecision
    derived: int
    joint: int
    basis: torch.Tensor

    @property
    def dimension(self) -> int:
        """``P − rank``: the dimension of the first-order null space at this point."""
        return self.parameters - self.rank.rank

    @property
    def explained(self) -> int:
        """``dim(N ∩ T)``: null directions the derived symmetries span at this point."""
        return self.dimension + self.derived - self.joint

    @property
    def new(self) -> int:
        return self.dimension - self.explained

    @property
    def unconfirmed(self) -> int:
        """Derived tangent directions outside the null space (0 for sound claims at a differentiable point)."""
        return self.derived - self.explained

    def __str__(self) -> str:
        return (f"{self.model}: first-order null space of the {self.target} at one point: dimension "
                f"{self.dimension} of P = {self.parameters} ({self.constraints} constraints, rank {self.rank.rank}, "
                f"gap {self.rank.gap:.1e}); derived tangent {self.derived}: explained {self.explained}, new "
                f"{self.new}, unconfirmed {self.unconfirmed}")


def null_space_at(model_or_analysis: object, data: torch.Tensor | tuple, params: Mapping[str, torch.Tensor] |
                  None = None, *, target: str = "loss", seed: int = 0,
                  widths: Mapping[str, int] | None = None) -> PointNullSpace:
    """The first-order null space of the per-sample losses (``target="loss"``, squared error against targets drawn
    from ``seed``, or cross-entropy when the analysis says so) or of the outputs (``"function"``) at ``params``
    (default: the model's own) and the inputs ``data`` (module docstring). Float64, CPU.

    ``model_or_analysis`` as for :func:`symalg.discover` (a torch module is traced on ``data``).
    """
    if target not in ("function", "loss"):
        raise SpecError(f"null_space_at: target must be 'function' or 'loss', got {target!r}")
    if data is None:
        raise SpecError("null_space_at: pass the data points (a tensor or a tuple of the model's inputs)")
    analysis = _analysis(model_or_analysis, data, widths)
    problem = _Problem(analysis, data, target, seed)
    names = tuple(n for n, v in problem.params.items() if v.numel())
    if not names:
        raise SpecError("null_space_at: the model has no parameters")
    given = dict(problem.params) if params is None else {n: params[n] for n in names if n in params}
    for n in names:
        if n not in given:
            raise SpecError(f"null_space_at: params has no tensor {n!r}")
        if tuple(given[n].shape) != tuple(problem.params[n].shape):
            raise SpecError(f"null_space_at: params[{n!r}] has shape {tuple(given[n].shape)}, the model's is "
                            f"{tuple(problem.params[n].shape)}")
    layout = ParameterLayout(names, {n: tuple(problem.params[n].shape) for n in names}, (), False)  # no unknowns
    theta = torch.cat([given[n].detach().to(torch.float64).reshape(-1) for n in names])
    J = torch.func.jacrev(problem.outputs(layout, problem.inputs))(theta).reshape(-1, theta.numel())
    decision = certified_rank(J, what=f"{target} constraints")
    _, _, Vh = torch.linalg.svd(J, full_matrices=True)
    basis = Vh[decision.rank:]
    continuous = any(s.group.is_continuous for s in analysis.symmetries)
    T = action_matrix(analysis, layout.unflatten(theta)) if continuous else theta.new_zeros(0, theta.numel())
    derived = _rank(T)
    joint = _rank(torch.cat([basis, T])) if T.shape[0] else basis.shape[0]
    return PointNullSpace(analysis._name(), target, theta.numel(), J.shape[0], decision, derived, joint, basis)
