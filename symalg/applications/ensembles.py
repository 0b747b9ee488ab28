"""Symmetry ensembles and their adversarial robustness ([Zhao2026] Sec. 2.9).

One trained MLP ``θ`` is turned into an ensemble by the data-dependent action of
:mod:`symalg.applications.nonlinear_actions`: member ``i`` is ``θ_i = g_i·(θ, X_i)`` with a random ``g_i ∈ ∏ GL(n_l)``
and an anchor batch ``X_i`` (``k ≤`` width rows). Then ``F(θ_i, x) = F(θ, x)`` exactly for ``x ∈ X_i``
and differs elsewhere. Baselines: independently trained models, and random Gaussian perturbations
``θ + d_i u_i/‖u_i‖`` with ``d_i = ‖θ_i − θ‖`` (the same parameter-space distance as symmetry member ``i``).

A member is a callable ``x (N, n) → logits (N, m)``. The ensemble predicts with the **average of the
member softmaxes**, ``p(x) = (1/M) Σ_i softmax(F_i(x))``; attacks maximise the cross-entropy
``−log p_y(x)`` of that average (white box) or of another model's (transfer). FGSM:
``x' = clip(x + ε sign ∇ₓL)``; PGD (L∞): ``x ← clip(Π_ε(x + α sign ∇ₓL))`` for ``steps`` steps, started
at ``x``; inputs clipped to ``[lo, hi]``.

The *per-input* variant (:func:`per_input_symmetry_ensemble`) re-anchors the action at every input it
evaluates, as [Zhao2026]'s "modified activation" does; with the anchor detached from autograd its
outputs equal the base model's exactly while its input gradients differ (gradient masking, not robustness).

>>> import torch
>>> from torch import nn
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).double()
>>> x = torch.randn(5, 4, dtype=torch.float64)
>>> ens = symmetry_ensemble(model, x, size=2, scale=0.5, generator=torch.Generator().manual_seed(1), anchor_size=5)
>>> bool((ens.members[0](x) - model(x)).abs().max() < 1e-10)
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from symalg.applications.nonlinear_actions import DataDependentAction, random_gl
from symalg.numeric.feedforward import FeedForward

__all__ = ["Ensemble", "RobustnessTable", "accuracy", "evaluate_robustness", "fgsm", "independent_ensemble",
           "parameter_distance", "per_input_symmetry_ensemble", "perturbation_ensemble", "pgd", "symmetry_ensemble"]

Model = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Ensemble:
    """Members ``x ↦ logits``; ``distances[i] = ‖θ_i − θ‖₂`` from the base parameters (``nan``: unrelated)."""

    name: str
    members: tuple[Model, ...]
    distances: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError(f"Ensemble {self.name!r}: members is empty")

    def log_probs(self, x: torch.Tensor) -> torch.Tensor:
        """``log((1/M) Σ_i softmax(F_i(x)))`` (the averaged softmax), shape ``(N, m)``."""
        logs = torch.stack([torch.log_softmax(f(x), -1) for f in self.members])
        return torch.logsumexp(logs, 0) - math.log(len(self.members))

    __call__ = log_probs


def parameter_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """``‖a − b‖₂`` over all entries of two parameter dicts with the same keys."""
    if a.keys() != b.keys():
        raise ValueError(f"parameter_distance: keys differ ({sorted(a)} vs {sorted(b)})")
    return math.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in a))


def _base(model: nn.Sequential) -> tuple[FeedForward, dict[str, torch.Tensor]]:
    net = FeedForward.of(model)
    return net, {k: v.detach() for k, v in model.named_parameters()}


def _draw_g(net: FeedForward, params: Mapping[str, torch.Tensor], scale: float,
            generator: torch.Generator | None) -> list[torch.Tensor]:
    w = params[net.weights[0]]
    return [random_gl(params[name].shape[-2], scale, generator=generator, dtype=w.dtype)
            for name in net.weights[: net.sites]]


def symmetry_ensemble(model: nn.Sequential, anchors: torch.Tensor, size: int, scale: float,
                      generator: torch.Generator | None = None, anchor_size: int | None = None) -> Ensemble:
    """``size`` members ``g_i·(θ, X_i)``: ``g_i = random_gl(·, scale)`` per hidden site, ``X_i`` a random subset of
    ``anchor_size`` rows of ``anchors`` (exact frames allow up to the narrowest width ``h``; default
    ``min(len(anchors), h // 2)``, because at ``k = h`` the frame is the square ``σ(Z)`` itself, often
    ill-conditioned, and ``‖θ_i − θ‖`` explodes). Member ``i`` reproduces ``model`` on ``X_i`` to rounding error.
    """
    if size < 1:
        raise ValueError(f"symmetry_ensemble: size must be ≥ 1, got {size}")
    net, params = _base(model)
    width = min(params[w].shape[-2] for w in net.weights[: net.sites])
    k = min(len(anchors), max(1, width // 2)) if anchor_size is None else anchor_size
    if not 1 <= k <= min(len(anchors), width):
        raise ValueError(f"symmetry_ensemble: anchor_size = {anchor_size} must lie in 1…min(len(anchors) = "
                         f"{len(anchors)}, narrowest width = {width})")
    action, members, distances = DataDependentAction(net), [], []
    for _ in range(size):
        rows = torch.randperm(len(anchors), generator=generator)[:k]
        new = action(params, _draw_g(net, params, scale, generator), anchors[rows])
        members.append(partial(net.forward, new))
        distances.append(parameter_distance(new, params))
    return Ensemble("symmetry", tuple(members), tuple(distances))


def per_input_symmetry_ensemble(model: nn.Sequential, size: int, scale: float,
                                generator: torch.Generator | None = None) -> Ensemble:
    """Members ``x ↦ F(g_i·(θ, sg[x]), x)``, anchored at each input itself (``sg``: stop-gradient).

    Outputs equal ``model``'s at every input (to rounding); gradients ``∇ₓ`` differ because the
    parameters' dependence on ``x`` is cut. ``distances`` is empty (the parameters change per input).
    """
    if size < 1:
        raise ValueError(f"per_input_symmetry_ensemble: size must be ≥ 1, got {size}")
    net, params = _base(model)
    action = DataDependentAction(net)

    def member(g: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        rows = x.unsqueeze(-2)  # (N, 1, n): one anchor per input, broadcast over N
        return net.forward(action(params, g, rows.detach()), rows)[..., 0, :]

    return Ensemble("symmetry per-input", tuple(partial(member, _draw_g(net, params, scale, generator))
                                                 for _ in range(size)))


def perturbation_ensemble(model: nn.Sequential, distances: Sequence[float],
                          generator: torch.Generator | None = None) -> Ensemble:
    """Members ``θ + d_i u_i/‖u_i‖₂`` with Gaussian ``u_i`` over all parameters (one member per ``d_i``)."""
    if not distances or min(distances) < 0:
        raise ValueError(f"perturbation_ensemble: distances must be non-empty and ≥ 0, got {list(distances)}")
    net, params = _base(model)
    members = []
    for d in distances:
        noise = {k: torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in params.items()}
        norm = parameter_distance(noise, {k: torch.zeros_like(v) for k, v in noise.items()})
        members.append(partial(net.forward, {k: params[k] + d / norm * noise[k] for k in params}))
    return Ensemble("perturbation", tuple(members), tuple(float(d) for d in distances))


def independent_ensemble(models: Sequence[nn.Module]) -> Ensemble:
    """Independently trained models as members (``distances`` are ``nan``: no common base)."""
    return Ensemble("independent", tuple(models), tuple(math.nan for _ in models))


def accuracy(model: Model, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows with ``argmax model(x) = y``.

    >>> accuracy(lambda x: x, torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]]), torch.tensor([0, 0, 0]))
    0.6666666666666666
    """
    if len(x) != len(y):
        raise ValueError(f"accuracy: x has {len(x)} rows but y has {len(y)}")
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).double().mean())


def _gradient_sign(model: Model, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = x.detach().requires_grad_(True)
    loss = nn.functional.cross_entropy(model(x), y)  # log-probs are valid logits: log_softmax is idempotent
    (grad,) = torch.autograd.grad(loss, x)
    return grad.sign()


def fgsm(model: Model, x: torch.Tensor, y: torch.Tensor, eps: float,
         bounds: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """``clip(x + ε sign ∇ₓ CE(model(x), y), *bounds)``; ``model`` returns logits or log-probabilities."""
    if eps < 0:
        raise ValueError(f"fgsm: eps must be ≥ 0, got {eps}")
    return (x + eps * _gradient_sign(model, x, y)).clamp(*bounds).detach()


def pgd(model: Model, x: torch.Tensor, y: torch.Tensor, eps: float, steps: int, step_size: float,
        bounds: tuple[float, float] = (0.0, 1.0)) -> torch.Tensor:
    """L∞ PGD from ``x``: ``steps`` signed-gradient steps of ``step_size``, projected on ``‖x' − x‖∞ ≤ ε``
    and ``bounds``."""
    if eps < 0 or steps < 1 or step_size <= 0:
        raise ValueError(f"pgd: need eps ≥ 0, steps ≥ 1, step_size > 0; got eps={eps}, steps={steps}, "
                         f"step_size={step_size}")
    adv = x.detach()
    for _ in range(steps):
        adv = adv + step_size * _gradient_sign(model, adv, y)
        adv = torch.minimum(torch.maximum(adv, x - eps), x + eps).clamp(*bounds).detach()
    return adv


@dataclass
class RobustnessTable:
    """Accuracies: ``rows[name][column]``. Columns: ``clean``, ``fgsm@ε``, ``pgd@ε`` (white box on the row's
    model), ``transfer_fgsm@ε``/``transfer_pgd@ε`` (adversarial inputs crafted on the source model)."""

    columns: list[str]
    rows: dict[str, dict[str, float]] = field(default_factory=dict)

    def format(self) -> str:
        """A Markdown table."""
        head = "| model | " + " | ".join(self.columns) + " |"
        rule = "|---" * (len(self.columns) + 1) + "|"
        body = ["| " + name + " | " + " | ".join(f"{row[c]:.3f}" for c in self.columns) + " |"
                for name, row in self.rows.items()]
        return "\n".join([head, rule, *body])

    def tokens(self) -> str:
        """``key=value`` tokens, key ``<row>_<column>`` with non-word characters replaced by ``_``."""
        def key(s: str) -> str:
            return "".join(ch if ch.isalnum() else "_" for ch in s)
        return " ".join(f"{key(name)}_{key(c)}={row[c]:.4f}" for name, row in self.rows.items() for c in self.columns)


def evaluate_robustness(models: Mapping[str, Model], x: torch.Tensor, y: torch.Tensor, fgsm_eps: Sequence[float],
                        pgd_eps: float, pgd_steps: int, pgd_step_size: float, source: Model | None = None,
                        bounds: tuple[float, float] = (0.0, 1.0)) -> RobustnessTable:
    """Clean, FGSM (each ``ε``) and PGD accuracy of every model; with ``source``, also transfer attacks from it."""
    table = RobustnessTable(["clean"] + [f"fgsm@{e:g}" for e in fgsm_eps] + [f"pgd@{pgd_eps:g}"])
    transfer = {}
    if source is not None:
        transfer = {f"transfer_fgsm@{e:g}": fgsm(source, x, y, e, bounds) for e in fgsm_eps}
        transfer[f"transfer_pgd@{pgd_eps:g}"] = pgd(source, x, y, pgd_eps, pgd_steps, pgd_step_size, bounds)
        table.columns += list(transfer)
    for name, model in models.items():
        row = {"clean": accuracy(model, x, y)}
        row.update({f"fgsm@{e:g}": accuracy(model, fgsm(model, x, y, e, bounds), y) for e in fgsm_eps})
        row[f"pgd@{pgd_eps:g}"] = accuracy(model, pgd(model, x, y, pgd_eps, pgd_steps, pgd_step_size, bounds), y)
        row.update({c: accuracy(model, adv, y) for c, adv in transfer.items()})
        table.rows[name] = row
    return table
