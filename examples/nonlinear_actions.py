"""Measured errors of the data-dependent GL(h) actions and of the teleportation actions.

Prints one table per part; every number is a maximum (or median where said) of a relative error over
seeded draws, in float64. ``key=value`` tokens at the end of each table summarise it for scripts.

* A. frames ``R_z``: ``R_z e₁ = z``, ``R_zᵀR_z = |z|²I``, ``‖R_z‖ = |z|`` (draws include near-degenerate ``z``);
* B. two-layer action at one point: output at ``x``, unit and multiplication axioms, per activation;
* C. multi-layer action (three hidden sites, biases) at a batch of ``k ≤`` widths;
* D. batch-size limit: the frame action up to ``k = h``; beyond it, even the least-squares best ``U'`` misses;
* E. cocycle axioms: the frame cocycle against three wrong ones;
* F. Lipschitz bound of Prop. 2.4.2: empirical constant / bound, and the printed general form that drops ``‖g‖``;
* G. teleportation eqs. 4.13 / 4.16 against the frame action over batch sizes.

Run: ``python examples/nonlinear_actions.py`` (about 20 s), ``--quick`` for fewer draws.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from symalg.applications.nonlinear_actions import (DataDependentAction, FrameCocycle, check_cocycle, lipschitz_bounds,
                                                   random_gl, spherical_frame, two_layer_action)
from symalg.applications.teleport_actions import ApproximateTeleport, ExactTeleport, leaky_relu, measure_action
from symalg.numeric.feedforward import FeedForward

ACTIVATIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "leaky_relu(0.1)": lambda z: F.leaky_relu(z, 0.1),
               "gelu": F.gelu, "softplus": F.softplus}


def table(title, header, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    print(f"\n{title}")
    for row in [header, ["-" * w for w in widths], *rows]:
        print("  " + "  ".join(str(c).rjust(w) for c, w in zip(row, widths)))


def e(v):
    return f"{v:.1e}"


def rel(a, b):
    return (torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b)).max().item()


def frames(draws, gen):
    rows, worst = [], 0.0
    for h in (1, 2, 3, 8, 32):
        z = torch.randn(draws, h, generator=gen)
        step = draws // 8
        z[:step, 1:] = 0                      # z ∥ e₁
        z[step:2 * step, 1:] *= 1e-13         # nearly ∥ e₁
        z[2 * step:3 * step, :-1] = 0         # z ∥ e_h
        z[3 * step:4 * step] *= 1e-150        # tiny
        z[4 * step:5 * step] *= 1e150         # huge
        r, n = spherical_frame(z), z.norm(dim=-1)
        errs = [((r[..., 0] - z).norm(dim=-1) / n).max().item(),
                (r.transpose(-1, -2) @ r / n[:, None, None] ** 2 - torch.eye(h)).abs().max().item(),
                (torch.linalg.matrix_norm(r, ord=2) / n - 1).abs().max().item()]
        worst = max(worst, *errs)
        rows.append([h, draws, *map(e, errs)])
    table("A. spherical frames R_z (max relative error over draws, 5/8 of them near-degenerate)",
          ["h", "draws", "R_z e1 = z", "R_zᵀR_z = |z|²I", "‖R_z‖ = |z|"], rows)
    print(f"  frame_max_error={worst:.3e}")


def two_layer(draws, gen):
    rows, worst = [], 0.0
    m, h, n = 3, 6, 4
    for name, sigma in ACTIVATIONS.items():
        u, v, x = torch.randn(draws, m, h, generator=gen), torch.randn(draws, h, n, generator=gen), \
            torch.randn(draws, 1, n, generator=gen)
        g1, g2 = (random_gl(h, scale=1.5, batch=(draws,), generator=gen) for _ in range(2))

        def out(u_, v_):
            return u_ @ sigma(v_ @ x.transpose(-1, -2))
        u1, v1 = two_layer_action(u, v, g1, x, sigma)
        ue, _ = two_layer_action(u, v, torch.eye(h).expand(draws, h, h), x, sigma)
        u12, _ = two_layer_action(*two_layer_action(u, v, g2, x, sigma), g1, x, sigma)
        up, _ = two_layer_action(u, v, g1 @ g2, x, sigma)
        other = torch.randn(draws, 1, n, generator=gen)
        moved = (torch.linalg.matrix_norm(u1 @ sigma(v1 @ other.mT) - u @ sigma(v @ other.mT))
                 / torch.linalg.matrix_norm(u @ sigma(v @ other.mT))).median().item()
        errs = [rel(out(u1, v1), out(u, v)), rel(ue, u), rel(u12, up)]
        worst = max(worst, *errs)
        rows.append([name, draws, *map(e, errs), f"{moved:.2f}"])
    table(f"B. two-layer action g·(U, V, x) = (U R_σ(Vx) R_σ(gVx)⁻¹, gV, x), (m, h, n) = ({m}, {h}, {n}), "
          "g = exp(1.5 N/√h)", ["σ", "draws", "output at x", "unit axiom", "mult. axiom", "change elsewhere (median)"],
          rows)
    print(f"  two_layer_max_error={worst:.3e}")


def multilayer(draws, gen):
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 7), nn.Sigmoid(), nn.Linear(7, 6),
                          nn.LeakyReLU(0.2), nn.Linear(6, 3))
    net, act = FeedForward.of(model), DataDependentAction(FeedForward.of(model))
    params = {k: torch.randn(draws, *p.shape, generator=gen) for k, p in model.named_parameters()}
    rows, worst = [], 0.0
    for k in (1, 2, 4):
        x = torch.randn(draws, k, 4, generator=gen)
        g1, g2 = ([random_gl(w, batch=(draws,), generator=gen) for w in (5, 7, 6)] for _ in range(2))
        moved = act(params, g1, x)
        twice, once = act(act(params, g2, x), g1, x), act(params, [a @ b for a, b in zip(g1, g2)], x)
        ident = act(params, [torch.eye(w).expand(draws, w, w) for w in (5, 7, 6)], x)

        def dist(p, q):
            return max(rel(p[n_].reshape(draws, -1, 1), q[n_].reshape(draws, -1, 1)) for n_ in q)
        errs = [rel(net.forward(moved, x), net.forward(params, x)), dist(ident, params), dist(twice, once)]
        worst = max(worst, *errs)
        rows.append([k, draws, *map(e, errs)])
    table("C. multi-layer action, widths 4-5-7-6-3 (tanh, sigmoid, leaky ReLU), biases, g ∈ GL(5)×GL(7)×GL(6)",
          ["batch k", "draws", "output on batch", "unit axiom", "mult. axiom"], rows)
    print(f"  multilayer_max_error={worst:.3e}")


def batch_limit(draws, gen):
    h, rows = 4, []
    for k in range(1, 9):
        u, v, x = torch.randn(draws, 3, h, generator=gen), torch.randn(draws, h, 6, generator=gen), \
            torch.randn(draws, k, 6, generator=gen)
        g = random_gl(h, batch=(draws,), generator=gen)
        target = u @ torch.tanh(v @ x.mT)
        b = torch.tanh(g @ v @ x.mT)
        best = torch.linalg.lstsq(b.mT, target.mT, driver="gelsd").solution.mT
        residual = (torch.linalg.matrix_norm(best @ b - target) / torch.linalg.matrix_norm(target))
        try:
            u2, v2 = two_layer_action(u, v, g, x, torch.tanh)
            err = (torch.linalg.matrix_norm(u2 @ torch.tanh(v2 @ x.mT) - target) / torch.linalg.matrix_norm(target))
            cond = torch.linalg.cond(b)
            frame_col = f"{err.median().item():.1e} / {err.max().item():.1e}"
            ratio = f"{(err / cond).max().item():.1e}"
        except ValueError:
            frame_col, ratio = "undefined (k > h)", "-"
        rows.append([k, frame_col, ratio, f"{residual.min().item():.1e}"])
    table(f"D. batch-size limit, h = {h}, tanh ({draws} draws): frame action error (median / max), error / "
          "cond σ(gVX), and min over draws of the least-squares best residual min_U' ‖U'σ(gVX) − Uσ(VX)‖",
          ["k", "frame action", "err / cond", "best residual"], rows)


def cocycles(draws, gen):
    sigma = torch.tanh
    g1, g2 = (random_gl(5, batch=(draws,), generator=gen) for _ in range(2))

    def fr(a):
        return spherical_frame(sigma(a)[..., 0])
    candidates = {
        "R_σ(gz) R_σ(z)⁻¹ (frame, k = 1)": (FrameCocycle(sigma), 1),
        "F_σ(gZ) F_σ(Z)⁻¹ (QR frame, k = 3)": (FrameCocycle(sigma), 3),
        "R_σ(z)⁻¹ R_σ(gz) (order swapped)": (lambda g, a: torch.linalg.solve(fr(a), fr(g @ a)), 1),
        "R_σ(gz) R_σ(z)ᵀ (not normalised)": (lambda g, a: fr(g @ a) @ fr(a).mT, 1),
        "π(g) = g (linear)": (lambda g, a: g, 1),
    }
    rows = []
    for name, (c, k) in candidates.items():
        r = check_cocycle(c, g1, g2, torch.randn(draws, 5, k, generator=gen), sigma)
        rows.append([name, e(r.identity_error), e(r.composition_error), e(r.equivariance_error),
                     "pass" if r.passed else "FAIL"])
    table(f"E. cocycle axioms c(e, Z) = I, c(g₁, g₂Z) c(g₂, Z) = c(g₁g₂, Z), equivariance c(g, Z)σ(Z) = σ(gZ) "
          f"(tanh, h = 5, {draws} draws)", ["c(g, Z)", "unit", "multiplication", "equivariance", "verdict"], rows)


def lipschitz(draws, gen):
    rows = []
    samples = torch.randn(128, 3, generator=gen)
    for name, sigma, eta in (("tanh", torch.tanh, 1.0), ("sigmoid", torch.sigmoid, 0.25),
                             ("leaky_relu(0.1)", ACTIVATIONS["leaky_relu(0.1)"], 1.0)):
        ratios, sharp, held, violated = [], [], 0, 0
        for _ in range(draws):
            u, v, x = torch.randn(2, 5, generator=gen), torch.randn(5, 3, generator=gen), torch.randn(3, generator=gen)
            g = random_gl(5, scale=1.5, generator=gen)
            b = lipschitz_bounds(u, v, g, x, sigma, eta, samples=samples)
            held += b.holds
            ratios.append(b.empirical / b.bound)
            sharp.append(b.sharp / b.bound)
            norm_g = torch.linalg.matrix_norm(g, ord=2).item()
            violated += b.empirical > b.bound / norm_g  # the printed general form, without ‖g‖
        t = torch.tensor(ratios)
        rows.append([name, draws, f"{held}/{draws}", f"{t.median():.2f} / {t.max():.2f}",
                     f"{torch.tensor(sharp).median():.2f}", f"{violated}/{draws}"])
    table("F. Lipschitz constant after the action (Prop. 2.4.2, h = 5, g = exp(1.5 N/√5))",
          ["σ", "draws", "bound holds", "empirical / bound (median / max)", "sharp / bound", "printed form violated"],
          rows)


def teleport(seeds, gen):
    rows = []
    for k in (1, 4, 7, 8, 9, 10, 14):
        worst = {}
        for seed in range(seeds):
            torch.manual_seed(seed)
            act = leaky_relu(0.1)
            model = nn.Sequential(nn.Linear(10, 8), act, nn.Linear(8, 7), act, nn.Linear(7, 2))
            net, params = FeedForward.of(model), {n: p.detach() for n, p in model.named_parameters()}
            x, y = torch.randn(k, 10, generator=gen), torch.randn(k, 2, generator=gen)
            g1, g2 = random_gl(7, generator=gen), random_gl(7, generator=gen)

            def loss(p):
                return ((net.forward(p, x) - y) ** 2).mean()
            actions = [ExactTeleport(net, 1), ExactTeleport(net, 1, complete=True), ApproximateTeleport(net, 1)]
            if k <= 7:
                actions.append(DataDependentAction(net))
            for a in actions:
                frame_action = isinstance(a, DataDependentAction)
                m = measure_action(a, params, x, {1: g1} if frame_action else g1, {1: g2} if frame_action else g2,
                                   loss=loss)
                errs = (m.relative_loss_change, m.identity_error, m.composition_error)
                worst[m.label] = tuple(max(p, q) for p, q in zip(worst.get(m.label, (0, 0, 0)), errs))
        for label, errs in worst.items():
            rows.append([k, label.replace("DataDependentAction", "frame action (QR)"), *map(e, errs)])
    table(f"G. teleportation at site 1 of 10-8-7-2 (leaky ReLU 0.1, biases): eq. 4.13 input width d = 8 + 1, "
          f"site width d_s = 7; max over {seeds} seeds", ["k", "action", "rel. loss change", "identity error",
                                                         "composition error"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer draws")
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    draws = 100 if args.quick else 500
    gen = torch.Generator().manual_seed(2024)
    start = time.perf_counter()
    frames(draws, gen)
    two_layer(draws, gen)
    multilayer(draws, gen)
    batch_limit(draws, gen)
    cocycles(draws, gen)
    lipschitz(10 if args.quick else 40, gen)
    teleport(3 if args.quick else 10, gen)
    print(f"\nelapsed_seconds={time.perf_counter() - start:.1f}")


if __name__ == "__main__":
    main()
