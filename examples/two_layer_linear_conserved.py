"""Conserved layer imbalance of a two-layer linear network: Xavier statistics and gradient-descent drift.

The network is ``linear(n, h) -> identity -> linear(h, m, bias=False)`` with ``(n, h, m) = (8, 16, 4)``:
``f(x) = W_2 (W_1 x + b_1)``, ``W_1 ∈ R^{h×n}``, ``b_1 ∈ R^h``, ``W_2 ∈ R^{m×h}`` (torch layout, out × in).
Its hidden site carries the symmetry ``GL(h)`` and :mod:`symalg` derives the conserved matrix

    C = W_1 W_1ᵀ + b_1 b_1ᵀ − W_2ᵀ W_2                                       (h × h),

conserved entrywise by gradient flow. Every evaluation of ``C`` below goes through
``symalg.derive(arch).conserved_quantities()``; a hand-written ``C`` serves only as a cross-check.

Part (a): Xavier initialisation
-------------------------------
Each sample is a fresh ``nn.Linear`` initialisation in which the weights are then redrawn with
``torch.nn.init.xavier_normal_`` and the bias keeps torch's default ``nn.Linear`` initialisation,
``b_1,i ~ U(−1/√n, 1/√n)`` (``fan_in = n``). All entries are independent, with

    Var(W_1,ij) = σ_1² = 2/(n + h),   Var(W_2,ij) = σ_2² = 2/(h + m),   Var(b_1,i) = a²/3 = 1/(3n),

where ``a = 1/√n`` is the bias bound. The diagonal entry ``C_ii = Σ_k W_1,ik² + b_1,i² − Σ_k W_2,ki²``
sums ``n`` squares of ``N(0, σ_1²)``, one square of ``U(−a, a)`` and minus ``m`` squares of
``N(0, σ_2²)``, all independent, so

    E[C_ii] = n σ_1² + a²/3 − m σ_2² = 2n/(n + h) + 1/(3n) − 2m/(h + m).

Off the diagonal every term of ``C_ij = Σ_k W_1,ik W_1,jk + b_1,i b_1,j − Σ_k W_2,ki W_2,kj`` (``i ≠ j``)
is a product of two independent centred variables, so ``E[C_ij] = 0``; hence
``E[C] = (2n/(n + h) + 1/(3n) − 2m/(h + m)) I``. (Without the bias the ``1/(3n)`` term drops out.)

Variances follow from independence. For ``Z ~ N(0, σ²)``, ``Var(Z²) = 2σ⁴``; for ``b ~ U(−a, a)``,
``E b² = a²/3`` and ``E b⁴ = a⁴/5``, so ``Var(b²) = 4a⁴/45``:

    Var(C_ii) = 2n σ_1⁴ + 4a⁴/45 + 2m σ_2⁴ = 8n/(n + h)² + 4/(45 n²) + 8m/(h + m)²,
    Var(C_ij) = n σ_1⁴ + (a²/3)² + m σ_2⁴ = 4n/(n + h)² + 1/(9 n²) + 4m/(h + m)²     (i ≠ j).

Tolerances. The ``h`` diagonal entries of one sample use disjoint rows of ``W_1``, entries of ``b_1`` and
columns of ``W_2``, so over ``S`` samples the ``N = S h`` diagonal entries are i.i.d.: the empirical mean
has standard error ``√(Var(C_ii)/N)``. The sample variance has standard error ``√((κ_4 + 2 Var²)/N)``
(to leading order), ``κ_4`` the fourth cumulant of ``C_ii``; cumulants add over independent terms, with
``κ_4(σ² Z²) = 48 σ⁸`` and ``κ_4(b²) = −32 a⁸/4725``, so

    κ_4(C_ii) = 768 n/(n + h)⁴ − 32/(4725 n⁴) + 768 m/(h + m)⁴.

Off-diagonal entries are pairwise uncorrelated (each covariance contains an odd power of some entry),
so their empirical mean has standard error ``√(Var(C_ij)/N_off)`` as well.

Part (b): gradient descent
--------------------------
Plain gradient descent ``θ' = θ − η g`` on the loss ``½ mean ‖f(x) − y‖²`` of a noisy linear teacher
(fixed seed, same Xavier initialisation for every learning rate). Because ``C`` is quadratic and its
first variation vanishes along the gradient (``⟨∇L, M·θ⟩ = 0``), one step changes it by exactly

    C(θ') − C(θ) = η² C(g)        (``C`` evaluated at the gradient tensors),

which is checked at every step. Summed over steps, the drift after ``T`` steps is

    ‖C(θ_T) − C(θ_0)‖_F = η² ‖Σ_{t<T} C(g_t)‖_F.

While ``η T λ_max ≪ 1`` (``λ_max`` the largest Hessian eigenvalue at initialisation, ``1/λ_max`` the
fastest relaxation time of gradient flow) the gradients ``g_t`` are η-independent to leading order and the
drift after a fixed number of steps scales as ``η²``. The learning rates ``1e-4 … 1.6e-3`` and the report
step ``T = 10`` are chosen so that ``η T λ_max ≲ 0.2`` for all of them; the script prints the drift
table and the fitted log-log slope there. Once training has relaxed (``η T λ_max ≫ 1``) the sum becomes
``η ∫_0^{ηT} C(g(s)) ds`` along the gradient-flow path, a convergent integral, so the drift scales only
as ``η``: the script also prints the slope after the last step and plots the slope against the step.
The per-step identity is reported as the maximum absolute error over all entries, steps and learning
rates; it sits at the float64 rounding level of the ``O(1)`` entries of ``C`` (the first step alone moves
``C`` by ``η² ‖C(g_0)‖_F ≈ 3e-7`` at the smallest learning rate).

Usage::

    python3 examples/two_layer_linear_conserved.py [--quick] [--out DIR]

Prints ``key=value`` lines (parsed by ``tests/test_examples.py``) and writes
``xavier_distribution.png`` and ``gd_drift.png`` into ``--out`` (default ``examples/output/``).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import symalg  # noqa: E402
from symalg.numeric.sampling import mse_loss  # noqa: E402

SPEC = "linear(n, h) -> identity -> linear(h, m, bias=False)"
WIDTHS = {"n": 8, "h": 16, "m": 4}
LEARNING_RATES = (1e-4, 2e-4, 4e-4, 8e-4, 1.6e-3)
REPORT_STEP = 10
SEED = 0
DEFAULT_OUT = Path(__file__).resolve().parent / "output"


def closed_form_moments(n: int, h: int, m: int) -> dict[str, float]:
    """Moments of the entries of ``C`` under the Xavier-normal / default-bias initialisation.

    Parameters
    ----------
    n, h, m : int
        Input, hidden and output widths.

    Returns
    -------
    dict
        ``mean_diag``, ``var_diag``, ``kappa4_diag`` (fourth cumulant) of a diagonal entry and
        ``var_offdiag`` of an off-diagonal entry (whose mean is 0); derivation in the module docstring.
    """
    return {
        "mean_diag": 2 * n / (n + h) + 1 / (3 * n) - 2 * m / (h + m),
        "var_diag": 8 * n / (n + h) ** 2 + 4 / (45 * n ** 2) + 8 * m / (h + m) ** 2,
        "kappa4_diag": 768 * n / (n + h) ** 4 - 32 / (4725 * n ** 4) + 768 * m / (h + m) ** 4,
        "var_offdiag": 4 * n / (n + h) ** 2 + 1 / (9 * n ** 2) + 4 * m / (h + m) ** 2,
    }


def xavier_sample(model: torch.nn.Sequential) -> dict[str, torch.Tensor]:
    """One initialisation: torch's default ``nn.Linear`` init, then Xavier-normal weights.

    Parameters
    ----------
    model : torch.nn.Sequential
        The network from :func:`symalg.to_module`; re-initialised in place (global torch RNG).

    Returns
    -------
    dict
        Detached copies of the parameters, keyed by parameter name.
    """
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                layer.reset_parameters()
                torch.nn.init.xavier_normal_(layer.weight)
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def imbalance_by_hand(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """``W_1 W_1ᵀ + b_1 b_1ᵀ − W_2ᵀ W_2`` written out directly (independent cross-check only)."""
    w1, b1, w2 = params["0.weight"], params["0.bias"].unsqueeze(-1), params["2.weight"]
    return w1 @ w1.mT + b1 @ b1.mT - w2.mT @ w2


def initialisation_statistics(imbalance, model, n_samples: int, out: Path) -> None:
    """Part (a): sample ``C`` at Xavier initialisations, compare with the closed form, plot histograms.

    Parameters
    ----------
    imbalance : callable
        ``params -> C``: the conserved matrix derived by symalg (evaluated on batched parameters).
    model : torch.nn.Sequential
        The network, re-initialised for every sample.
    n_samples : int
        Number of initialisations ``S``.
    out : Path
        Directory for ``xavier_distribution.png``.
    """
    torch.manual_seed(SEED)
    samples = [xavier_sample(model) for _ in range(n_samples)]
    batch = {name: torch.stack([s[name] for s in samples]) for name in samples[0]}
    C = imbalance(batch)  # (S, h, h)
    crosscheck_error = (C - imbalance_by_hand(batch)).abs().max().item()

    h = C.shape[-1]
    rows, cols = torch.triu_indices(h, h, offset=1)
    diagonal = C.diagonal(dim1=-2, dim2=-1).reshape(-1)
    off_diagonal = C[:, rows, cols].reshape(-1)
    moments = closed_form_moments(**WIDTHS)
    n_diag, n_off = diagonal.numel(), off_diagonal.numel()
    mean_se = math.sqrt(moments["var_diag"] / n_diag)
    var_se = math.sqrt((moments["kappa4_diag"] + 2 * moments["var_diag"] ** 2) / n_diag)
    offdiag_mean_se = math.sqrt(moments["var_offdiag"] / n_off)

    print(f"# (a) Xavier-normal weights, default torch bias; {n_samples} samples, widths {WIDTHS}")
    print(f"samples={n_samples} diagonal_entries={n_diag} offdiagonal_entries={n_off}")
    print(f"crosscheck_max_error={crosscheck_error:.3e}")
    print(f"mean_diag_empirical={diagonal.mean().item():.6f} mean_diag_closed_form={moments['mean_diag']:.6f} "
          f"mean_diag_standard_error={mean_se:.6f}")
    print(f"var_diag_empirical={diagonal.var().item():.6f} var_diag_closed_form={moments['var_diag']:.6f} "
          f"var_diag_standard_error={var_se:.6f}")
    print(f"mean_offdiag_empirical={off_diagonal.mean().item():.6f} mean_offdiag_closed_form=0 "
          f"mean_offdiag_standard_error={offdiag_mean_se:.6f}")
    print(f"var_offdiag_empirical={off_diagonal.var().item():.6f} "
          f"var_offdiag_closed_form={moments['var_offdiag']:.6f}")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = ((diagonal, moments["mean_diag"], moments["var_diag"], "diagonal $C_{ii}$"),
              (off_diagonal, 0.0, moments["var_offdiag"], "off-diagonal $C_{ij}$, $i<j$"))
    for ax, (values, mean, var, title) in zip(axes, panels):
        ax.hist(values.numpy(), bins=80, density=True, color="tab:blue", alpha=0.7, label="empirical")
        ax.axvline(mean, color="k", label="closed-form mean")
        for sign in (-1, 1):
            ax.axvline(mean + sign * math.sqrt(var), color="k", ls="--",
                       label="closed-form mean ± std" if sign < 0 else None)
        ax.axvline(values.mean().item(), color="tab:red", ls=":", label="empirical mean")
        ax.set(title=title, xlabel="value", ylabel="density")
        ax.legend(fontsize=8)
    fig.suptitle(rf"$C = W_1W_1^T + b_1b_1^T - W_2^TW_2$ at Xavier init, "
                 rf"$(n,h,m)=({WIDTHS['n']},{WIDTHS['h']},{WIDTHS['m']})$, {n_samples} samples")
    fig.tight_layout()
    fig.savefig(out / "xavier_distribution.png", dpi=120)
    plt.close(fig)


def gradient_descent_drift(imbalance, arch, init: dict[str, torch.Tensor], lr: float, n_steps: int,
                           x: torch.Tensor, y: torch.Tensor) -> tuple[list[float], float]:
    """Run plain gradient descent and track ``C``.

    Parameters
    ----------
    imbalance : callable
        ``params -> C``: the conserved matrix derived by symalg.
    arch : symalg.Architecture
        The concrete architecture.
    init : dict
        Initial parameters (not modified).
    lr : float
        Learning rate ``η``.
    n_steps : int
        Number of steps ``T``.
    x, y : torch.Tensor
        Regression inputs (batch × n) and targets (batch × m).

    Returns
    -------
    drift : list of float
        ``‖C(θ_t) − C(θ_0)‖_F`` for ``t = 0, ..., T``.
    identity_error : float
        ``max_t max_ij |C(θ_{t+1}) − C(θ_t) − η² C(g_t)|``.
    """
    loss = mse_loss(symalg.numeric.sampling.network_function(arch), x, y)
    params = {name: p.clone().requires_grad_(True) for name, p in init.items()}
    C0 = C = imbalance(init)
    drift, identity_error = [0.0], 0.0
    for _ in range(n_steps):
        grads = dict(zip(params, torch.autograd.grad(loss(params), list(params.values()))))
        with torch.no_grad():
            params = {name: (p - lr * grads[name]).requires_grad_(True) for name, p in params.items()}
            C_next = imbalance(params)
            identity_error = max(identity_error, (C_next - C - lr ** 2 * imbalance(grads)).abs().max().item())
            C = C_next
            drift.append(torch.linalg.matrix_norm(C - C0).item())
    return drift, identity_error


def largest_hessian_eigenvalue(loss, params: dict[str, torch.Tensor]) -> float:
    """``λ_max`` of the Hessian of ``loss`` at ``params`` (all parameters flattened into one vector).

    Parameters
    ----------
    loss : callable
        ``params ↦ scalar`` loss.
    params : dict
        The point, name → tensor.

    Returns
    -------
    float
        The largest eigenvalue; ``1/λ_max`` is the fastest relaxation time of gradient flow there.
    """
    sizes = [p.numel() for p in params.values()]

    def flat_loss(flat):
        chunks = torch.split(flat, sizes)
        return loss({name: chunk.view_as(p) for (name, p), chunk in zip(params.items(), chunks)})

    hessian = torch.autograd.functional.hessian(flat_loss, torch.cat([p.reshape(-1) for p in params.values()]))
    return torch.linalg.eigvalsh(hessian)[-1].item()


def loglog_slopes(learning_rates: torch.Tensor, drift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares fit ``log drift = slope · log η + intercept``, one fit per column of ``drift``.

    Parameters
    ----------
    learning_rates : torch.Tensor
        Shape ``(k,)``.
    drift : torch.Tensor
        Shape ``(k, s)``: the drift of each learning rate at ``s`` steps.

    Returns
    -------
    slope, intercept : torch.Tensor
        Shape ``(s,)`` each.
    """
    log_lr = torch.log(learning_rates)
    design = torch.stack([log_lr, torch.ones_like(log_lr)], dim=1)
    slope, intercept = torch.linalg.lstsq(design, torch.log(drift), driver="gelsd").solution
    return slope, intercept


def drift_scaling(imbalance, arch, model, n_steps: int, out: Path) -> None:
    """Part (b): drift of ``C`` under gradient descent at several learning rates; fit drift ∝ η^slope.

    Parameters
    ----------
    imbalance : callable
        ``params -> C``: the conserved matrix derived by symalg.
    arch : symalg.Architecture
        The concrete architecture.
    model : torch.nn.Sequential
        The network, re-initialised once for the shared starting point.
    n_steps : int
        Number of gradient-descent steps per learning rate (at least ``REPORT_STEP``).
    out : Path
        Directory for ``gd_drift.png``.
    """
    generator = torch.Generator().manual_seed(SEED + 1)
    batch, n, m = 64, WIDTHS["n"], WIDTHS["m"]
    x = torch.randn(batch, n, generator=generator, dtype=torch.float64)
    teacher = torch.randn(m, n, generator=generator, dtype=torch.float64) / math.sqrt(n)
    y = x @ teacher.T + 0.1 * torch.randn(batch, m, generator=generator, dtype=torch.float64)
    torch.manual_seed(SEED + 1)
    init = xavier_sample(model)
    sharpness = largest_hessian_eigenvalue(mse_loss(symalg.numeric.sampling.network_function(arch), x, y), init)

    learning_rates = torch.tensor(LEARNING_RATES, dtype=torch.float64)
    runs = [gradient_descent_drift(imbalance, arch, init, lr, n_steps, x, y) for lr in LEARNING_RATES]
    drift = torch.tensor([trajectory for trajectory, _ in runs], dtype=torch.float64)  # (k, n_steps + 1)
    identity_error = max(error for _, error in runs)
    slope, intercept = loglog_slopes(learning_rates, drift[:, 1:])  # slope[t - 1]: fit after t steps

    print(f"# (b) gradient descent, batch {batch}, float64; largest Hessian eigenvalue at init "
          f"lambda_max={sharpness:.4f}")
    print(f"{'learning_rate':>14} {'drift@' + str(REPORT_STEP):>14} {'drift/lr^2':>12} "
          f"{'drift@' + str(n_steps):>14} {'drift/lr':>12}")
    for lr, early, late in zip(LEARNING_RATES, drift[:, REPORT_STEP].tolist(), drift[:, -1].tolist()):
        print(f"{lr:>14.4g} {early:>14.6e} {early / lr ** 2:>12.3f} {late:>14.6e} {late / lr:>12.5f}")
    print(f"report_step={REPORT_STEP} eta_t_lambda_at_largest_lr={LEARNING_RATES[-1] * REPORT_STEP * sharpness:.4f} "
          f"fitted_slope={slope[REPORT_STEP - 1].item():.4f}")
    print(f"final_step={n_steps} eta_t_lambda_at_smallest_lr={LEARNING_RATES[0] * n_steps * sharpness:.4f} "
          f"fitted_slope_final={slope[-1].item():.4f}")
    print(f"max_step_identity_error={identity_error:.3e}")

    steps = torch.arange(1, n_steps + 1)
    fig, (ax_steps, ax_scaling, ax_slope) = plt.subplots(1, 3, figsize=(16, 4.5))
    for lr, trajectory in zip(LEARNING_RATES, drift):
        ax_steps.loglog(steps, trajectory[1:], label=rf"$\eta$ = {lr:g}")
    ax_steps.axvline(REPORT_STEP, color="gray", ls=":")
    ax_steps.set(xlabel="step $t$", ylabel=r"$\|C(\theta_t) - C(\theta_0)\|_F$",
                 title="drift of the conserved matrix under gradient descent")
    ax_steps.legend(fontsize=8)
    for t, marker in ((REPORT_STEP, "o"), (n_steps, "s")):
        fitted = torch.exp(intercept[t - 1] + slope[t - 1] * torch.log(learning_rates))
        line, = ax_scaling.loglog(learning_rates, drift[:, t], marker, label=f"after {t} steps")
        ax_scaling.loglog(learning_rates, fitted, "-", color=line.get_color(),
                          label=f"fit: slope {slope[t - 1].item():.3f}")
    ax_scaling.set(xlabel=r"learning rate $\eta$", ylabel=r"$\|C(\theta_T) - C(\theta_0)\|_F$",
                   title="drift scaling at a fixed number of steps")
    ax_scaling.legend(fontsize=8)
    ax_slope.semilogx(steps, slope)
    ax_slope.axhline(2, color="gray", ls=":")
    ax_slope.axhline(1, color="gray", ls=":")
    ax_slope.axvline(REPORT_STEP, color="gray", ls=":")
    ax_slope.set(xlabel="step $t$", ylabel=r"log-log slope of drift vs $\eta$",
                 title=r"$\eta^2$ while $\eta t \lambda_{max} \ll 1$, $\eta$ once converged")
    fig.tight_layout()
    fig.savefig(out / "gd_drift.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, derive ``C`` with symalg and run both parts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and steps (a few seconds)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the PNG plots")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    n_samples, n_steps = (2_000, 100) if args.quick else (50_000, 2_000)

    arch = symalg.parse(SPEC, **WIDTHS)
    (quantity,) = symalg.derive(arch).conserved_quantities()
    print(f"# conserved quantity derived by symalg: {quantity}")
    (name,) = quantity.exprs

    def imbalance(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return quantity(params)[name]

    model = symalg.to_module(arch)
    initialisation_statistics(imbalance, model, n_samples, args.out)
    drift_scaling(imbalance, arch, model, n_steps, args.out)


if __name__ == "__main__":
    main()
