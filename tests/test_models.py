"""Traced models: each derived table equals the one written here from theory, and every
reported symmetry passes the verifier in float64 (invariance, ⟨∇L, M·θ⟩ = 0, exact GD drift of Q)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import symalg


def analyse(model, *inputs, loss="mse"):
    model = model.double()
    inputs = tuple(x.double() if torch.is_floating_point(x) else x for x in inputs)
    analysis = symalg.derive(symalg.from_torch(model, inputs), loss=loss)
    refused = [str(e) for e in analysis.certification if not e.holds]
    assert not refused, f"certification refused true symmetries: {refused}"   # no false refusals
    report = symalg.verify(analysis)
    assert report.passed, "\n".join(str(c) for c in report.failures)
    checks = {c.check for c in report.checks}
    return analysis, report, checks


def table(analysis):
    return sorted(analysis.table())


class MixedMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(5, 3)
        self.fc4, self.fc5 = nn.Linear(3, 4), nn.Linear(4, 2)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x):
        h = F.relu(self.fc1(x))
        h = torch.tanh(self.fc2(h))
        h = self.fc4(self.fc3(h))          # identity site between fc3 and fc4
        return self.fc5(self.act(h))


def test_mlp_mixing_activations():
    analysis, report, checks = analyse(MixedMLP(), torch.randn(7, 3))
    assert table(analysis) == sorted([
        ("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0),
        ("fc2", "SignFlips(5)", 0), ("fc2", "S(5)", 0),
        ("fc3", "GL(3)", 9), ("fc3", "Shears(3)", 3),   # fc3's bias into fc4's across the identity site
        ("fc4", "PositiveScaling(4, alpha=1)", 4), ("fc4", "S(4)", 0)])
    assert checks == {"invariance", "gradient_orthogonality", "gd_drift", "gradient_flow", "lowering",
                      "orbit_dimension"}
    assert analysis.blocked == ()


def test_every_spelling_of_relu_is_one_op():
    class Spellings(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.ModuleList(nn.Linear(4, 4) for _ in range(6))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            x = self.relu(self.fc[0](x))
            x = F.relu(self.fc[1](x))
            x = torch.relu(self.fc[2](x))
            x = self.fc[3](x).relu()
            x = self.fc[4](x).relu_()
            return self.fc[5](x)

    graph = symalg.trace(Spellings().double(), (torch.randn(3, 4, dtype=torch.float64),))
    ops = [graph.node(v)["op"] for v in graph.nodes]
    assert ops.count("relu") == 5 and ops.count("linear") == 6
    analysis = symalg.derive(graph)
    assert sorted(n for _, n, _ in analysis.table()) == sorted(["PositiveScaling(4, alpha=1)"] * 5 + ["S(4)"] * 5)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.c2, self.b2 = nn.Conv2d(4, 6, 3), nn.BatchNorm2d(6)
        self.fc = nn.Linear(6 * 2 * 2, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(torch.flatten(x, 1))


def test_small_cnn_with_batch_norm_and_max_pooling():
    analysis, report, checks = analyse(SmallCNN(), torch.randn(5, 3, 8, 8))
    # Theory: a training-mode batch norm cancels translations of the conv bias (exact), and would cancel
    # per-channel scalings if eps were 0 (torch requires eps > 0: blocked and reported). Its gain and
    # bias are a diagonal map followed by ReLU (and max pooling): positive scaling. One permutation
    # moves conv rows, batch-norm parameters/buffers and the next layer's columns together.
    assert table(analysis) == sorted([
        ("c1", "Translations(4, bias)", 4), ("b1", "PositiveScaling(4, alpha=1)", 4), ("c1", "S(4)", 0),
        ("c2", "Translations(6, bias)", 6), ("b2", "PositiveScaling(6, alpha=1)", 6), ("c2", "S(6)", 0)])
    assert [b.node for b in analysis.blocked] == ["b1", "b2"]
    assert all("eps" in b.reason for b in analysis.blocked)
    quantities = {q.name: q for q in analysis.conserved_quantities()}
    assert str(quantities["ell_c1"]) == "ell_c1_c1_bias = c1.bias"
    assert str(quantities["q_b2"]) == "q_b2 = b2.bias∘^2 + b2.weight∘^2 - fc.weight_(1)/4∘^2*1"
    params = dict(analysis.model_graph.model.named_parameters())
    # the flatten binding reads each channel's 2x2 block of fc columns
    expected = params["b2.bias"] ** 2 + params["b2.weight"] ** 2 - \
        (params["fc.weight"].reshape(5, 6, 4) ** 2).sum((0, 2))
    torch.testing.assert_close(quantities["q_b2"](params)["q_b2"], expected)   # per-unit: shape (h,)


def test_batch_norm_in_eval_mode_permutes_running_statistics():
    model = SmallCNN().double()
    model(torch.randn(5, 3, 8, 8, dtype=torch.float64))   # non-trivial running statistics
    model.eval()
    analysis, report, _ = analyse(model, torch.randn(5, 3, 8, 8))
    # Theory: the running statistics replace the batch statistics, so a conv-bias translation leaves the
    # output unchanged only when the running mean moves with it. A scaling d of the conv's channels (sign flips
    # too) moves the running mean by d and the gain by 1/d, whatever eps (the variance stays).
    assert table(analysis) == sorted([
        ("c1", "Translations(4, bias)", 4), ("c1", "S(4)", 0), ("b1", "PositiveScaling(4, alpha=1)", 4),
        ("c1", "PositiveScaling(4, alpha=1)", 4), ("c1", "SignFlips(4)", 0),
        ("c2", "Translations(6, bias)", 6), ("c2", "S(6)", 0), ("b2", "PositiveScaling(6, alpha=1)", 6),
        ("c2", "PositiveScaling(6, alpha=1)", 6), ("c2", "SignFlips(6)", 0)])
    assert report.passed
    permutation = next(s for s in analysis.symmetries if s.label == "S(4) on c1")
    assert {"b1.running_mean", "b1.running_var"} <= set(permutation.tensors)
    translation = next(s for s in analysis.symmetries if s.label == "Translations(4, bias) on c1")
    assert translation.tensors == ("c1.bias", "b1.running_mean") and translation.acts_on_buffers
    assert translation.conserved is None     # the running mean is not trained: no conservation law
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    moved = translation.apply(state, torch.arange(4.0, dtype=torch.float64))
    torch.testing.assert_close(moved["b1.running_mean"] - state["b1.running_mean"],
                               torch.arange(4.0, dtype=torch.float64))
    torch.testing.assert_close(moved["c1.bias"] - state["c1.bias"], torch.arange(4.0, dtype=torch.float64))


class BasicBlock(nn.Module):
    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out)
        self.conv2, self.bn2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.block1, self.block2 = BasicBlock(4, 4), BasicBlock(4, 6, stride=2)
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.block2(self.block1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def test_resnet_basic_blocks_with_identity_and_projection_shortcuts():
    analysis, report, checks = analyse(TinyResNet(), torch.randn(4, 3, 6, 6))
    # Theory: convs have no bias, so no translations; eps > 0 blocks the batch-norm scalings. Each
    # batch norm's affine part starts a positively scaled site; the skip connection ties the stem's
    # with block1.bn2's (identity shortcut) and block2.bn2's with the shortcut's (projection).
    # Permutations move a conv's rows, its batch norm and every reader together, across the skip.
    assert table(analysis) == sorted([
        ("bn", "PositiveScaling(4, alpha=1)", 4),               # stream 1: stem bn + block1.bn2
        ("block1.bn1", "PositiveScaling(4, alpha=1)", 4),
        ("block2.bn1", "PositiveScaling(6, alpha=1)", 6),
        ("block2.shortcut.1", "PositiveScaling(6, alpha=1)", 6),  # stream 2: shortcut bn + block2.bn2
        ("stem", "S(4)", 0), ("block1.conv1", "S(4)", 0), ("block2.conv1", "S(6)", 0),
        ("block2.shortcut.0", "S(6)", 0)])
    stream = next(s for s in analysis.symmetries if s.label.startswith("PositiveScaling(4") and s.site == "bn")
    assert set(stream.members) == {"bn", "block1.bn2"}
    permutation = next(s for s in analysis.symmetries if s.label == "S(6) on block2.shortcut.0")
    assert set(permutation.members) == {"block2.shortcut.0", "block2.shortcut.1", "block2.conv2"}
    assert checks == {"invariance", "gradient_orthogonality", "gd_drift", "gradient_flow", "lowering",
                      "orbit_dimension"}


class PreNormBlock(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_gpt_pre_norm_block_with_multihead_attention():
    analysis, report, checks = analyse(PreNormBlock(), torch.randn(2, 5, 8))
    # Theory: the stream is the model input (fixed). Each LayerNorm's gain/bias is a diagonal map read
    # only by linear maps: positive scalings and sign flips. Per head, GL(d_k) on query/key rows (keys
    # by g⁻ᵀ) and GL(d_v) on value rows / output columns; one permutation of the 2 heads; GELU: S. The key
    # bias translates per head (it adds q_iᵀ t to every score of query i, which the softmax ignores). Each norm's
    # bias moves into the biases of the maps reading it (in_proj, fc1), each value bias into out_proj's bias.
    assert table(analysis) == sorted([
        ("ln1", "PositiveScaling(8, alpha=1)", 8), ("ln1", "SignFlips(8)", 0), ("ln1", "Shears(8)", 8),
        ("ln2", "PositiveScaling(8, alpha=1)", 8), ("ln2", "SignFlips(8)", 0), ("ln2", "Shears(8)", 8),
        ("attn.head0.vo", "Shears(4)", 4), ("attn.head1.vo", "Shears(4)", 4),
        ("attn.head0.qk", "GL(4)", 16), ("attn.head1.qk", "GL(4)", 16),
        ("attn.head0.qk", "Translations(4, bias)", 4), ("attn.head1.qk", "Translations(4, bias)", 4),
        ("attn.head0.vo", "GL(4)", 16), ("attn.head1.vo", "GL(4)", 16),
        ("attn.heads", "S(2)", 0), ("fc1", "S(32)", 0)])
    qk = next(s for s in analysis.symmetries if s.site == "attn.head1.qk")
    # query rows 4:8 of the packed in-projection minus key rows 12:16 (head 1, d = 8)
    assert str(qk.conserved) == ("C_attn_head1_qk = -attn.in_proj_bias[12:16]_(0)*attn.in_proj_bias[12:16]_(0).T + "
                                 "attn.in_proj_bias[4:8]_(0)*attn.in_proj_bias[4:8]_(0).T - "
                                 "attn.in_proj_weight[12:16]_(0)*attn.in_proj_weight[12:16]_(0).T + "
                                 "attn.in_proj_weight[4:8]_(0)*attn.in_proj_weight[4:8]_(0).T")
    params = dict(analysis.model_graph.model.named_parameters())
    W, b = params["attn.in_proj_weight"], params["attn.in_proj_bias"]
    expected = W[4:8] @ W[4:8].T + torch.outer(b[4:8], b[4:8]) - W[12:16] @ W[12:16].T - torch.outer(b[12:16], b[12:16])
    torch.testing.assert_close(qk.conserved(params)["C_attn_head1_qk"], expected)
    assert analysis.blocked == ()


class HandAttention(nn.Module):
    def __init__(self, d, heads, explicit):
        super().__init__()
        self.heads, self.explicit = heads, explicit
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        B, L, d = x.shape
        q, k, v = (f(x).view(B, L, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        if self.explicit:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            out = torch.softmax(scores, dim=-1) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(B, L, d))


class RMSTransformer(nn.Module):
    """Input projection, one block (hand-written attention, ReLU MLP), gain-free RMSNorms, output head."""

    def __init__(self, n=5, d=8, heads=2, explicit=False):
        super().__init__()
        self.embed = nn.Linear(n, d)
        self.norm1, self.norm2, self.norm3 = (nn.RMSNorm(d, elementwise_affine=False) for _ in range(3))
        self.attn = HandAttention(d, heads, explicit)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        x = self.embed(x)
        x = x + self.attn(self.norm1(x))
        x = x + self.down(F.relu(self.up(self.norm2(x))))
        return self.head(self.norm3(x))


@pytest.mark.parametrize("explicit", [False, True], ids=["sdpa", "explicit"])
def test_hand_written_attention_with_gain_free_rms_norm_has_an_orthogonal_stream(explicit):
    analysis, report, checks = analyse(RMSTransformer(explicit=explicit), torch.randn(2, 5, 5))
    # Theory: the residual stream is written by embed, attn.o and down and read by gain-free RMSNorms
    # only, which are O(d)-equivariant: O(8) on the stream (embed rows, q/k/v/up/head columns,
    # o/down rows). Heads as for nn.MultiheadAttention (key bias translations included); the ReLU MLP:
    # positive scaling and S(16). Each value bias moves into o's bias (the attention weights' rows sum to 1).
    assert table(analysis) == sorted([
        ("embed", "O(8)", 28), ("attn.head0.vo", "Shears(4)", 4), ("attn.head1.vo", "Shears(4)", 4),
        ("attn.head0.qk", "GL(4)", 16), ("attn.head1.qk", "GL(4)", 16),
        ("attn.head0.qk", "Translations(4, bias)", 4), ("attn.head1.qk", "Translations(4, bias)", 4),
        ("attn.head0.vo", "GL(4)", 16), ("attn.head1.vo", "GL(4)", 16),
        ("attn.heads", "S(2)", 0),
        ("up", "PositiveScaling(16, alpha=1)", 16), ("up", "S(16)", 0)])
    stream = next(s for s in analysis.symmetries if s.site == "embed")
    assert {"embed.weight", "attn.q.weight", "attn.o.weight", "down.weight", "head.weight"} <= set(stream.tensors)
    assert stream.conserved is None     # so(d) has no quadratic conserved quantity


def test_lora_adapter_rank_has_gl_r():
    class LoRALinear(nn.Module):
        def __init__(self, n, m, r):
            super().__init__()
            self.base = nn.Linear(n, m)
            self.lora_A, self.lora_B = nn.Linear(n, r, bias=False), nn.Linear(r, m, bias=False)

        def forward(self, x):
            return self.base(x) + self.lora_B(self.lora_A(x)) * 0.5

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.adapted, self.out = LoRALinear(6, 5, 2), nn.Linear(5, 3)

        def forward(self, x):
            return self.out(F.relu(self.adapted(x)))

    analysis, report, checks = analyse(Net(), torch.randn(9, 6))
    assert table(analysis) == sorted([
        ("adapted.lora_A", "GL(2)", 4),
        ("adapted.base", "PositiveScaling(5, alpha=1)", 5), ("adapted.base", "S(5)", 0)])
    rank = next(s for s in analysis.symmetries if s.site == "adapted.lora_A")
    assert str(rank.conserved) == ("C_adapted_lora_A = adapted.lora_A.weight*adapted.lora_A.weight.T - "
                                   "adapted.lora_B.weight.T*adapted.lora_B.weight")


def test_rbf_network_permutes_centres():
    class RBF(nn.Module):
        def __init__(self):
            super().__init__()
            self.centres = nn.Parameter(torch.randn(6, 3))
            self.out = nn.Linear(6, 2)

        def forward(self, x):
            return self.out(torch.exp(-0.5 * torch.cdist(x, self.centres) ** 2))

    analysis, report, _ = analyse(RBF(), torch.randn(8, 3))
    assert table(analysis) == [("centres", "S(6)", 0)]  # named after the parameter it permutes
    (symmetry,) = analysis.symmetries
    assert set(symmetry.tensors) == {"centres", "out.weight"}


def test_tied_embedding_and_unembedding_keep_only_orthogonal_stream_actions():
    class TiedLM(nn.Module):
        def __init__(self, vocabulary=11, d=6):
            super().__init__()
            self.embed = nn.Embedding(vocabulary, d)
            self.norm = nn.RMSNorm(d, elementwise_affine=False)

        def forward(self, tokens):
            return F.linear(self.norm(self.embed(tokens)), self.embed.weight)

    analysis, report, _ = analyse(TiedLM(), torch.randint(11, (3, 4)), loss="cross_entropy")
    # The stream is read (by the tied unembedding) and written (by the embedding) through the same
    # columns of one table: only orthogonal g keep it one tensor. Softmax translation of the logits
    # would move the embeddings too, so it is not claimed.
    assert table(analysis) == [("embed", "O(6)", 15)]


def test_softmax_cross_entropy_translation_and_its_linear_quantities():
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))
    analysis, report, checks = analyse(model, torch.randn(10, 4), loss="cross_entropy")
    assert ("2", "Translations(6, along 1)", 6) in analysis.table()
    translation = next(s for s in analysis.symmetries if s.group.name.startswith("Translations"))
    # the column sums 1ᵀW and 1ᵀb of the logits layer (SymPy prints the row of ones as 1)
    assert str(translation.conserved) == "ell__2__2_weight = 1*2.weight; ell__2__2_bias = 1*2.bias"
    params = dict(analysis.model_graph.model.named_parameters())
    values = translation.conserved(params)
    torch.testing.assert_close(values["ell__2__2_weight"].squeeze(0), params["2.weight"].sum(0))


def test_unknown_op_removes_exactly_the_symmetries_it_touches():
    class WithCumsum(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2, self.fc3 = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = F.relu(self.fc1(x))
            h = torch.cumsum(self.fc2(h), dim=-1)     # unknown: mixes the features of fc2's site
            return self.fc3(h)

    analysis, report, _ = analyse(WithCumsum(), torch.randn(6, 3))
    assert table(analysis) == sorted([("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)])
    (blocked,) = analysis.blocked
    assert blocked.node == "cumsum" and blocked.site == "fc2" and "not in the equivariance catalogue" in blocked.reason


def test_fx_failure_falls_back_to_export_and_reports_both_failures():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(3, 4), nn.Linear(4, 2)

        def forward(self, x):
            if x.dim() == 2:          # fx cannot branch on a traced value; export specialises it
                x = torch.relu(self.fc1(x))
            return self.fc2(x)

    graph = symalg.trace(Branchy().double(), (torch.randn(5, 3, dtype=torch.float64),))
    assert graph.tracer == "export"
    analysis = symalg.derive(graph)
    assert sorted(analysis.table()) == sorted([("fc1", "PositiveScaling(4, alpha=1)", 4), ("fc1", "S(4)", 0)])
    with pytest.raises(symalg.SpecError, match="torch.fx cannot trace Branchy.*pass example_inputs"):
        symalg.trace(Branchy())

    class Hopeless(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(symalg.SpecError, match="torch.fx cannot trace Hopeless .* torch.export failed too"):
        symalg.trace(Hopeless(), (torch.randn(2, 2),))


def test_reused_module_ties_its_sites():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.shared, self.out = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = F.relu(self.inp(x))
            h = F.relu(self.shared(h))
            return self.out(F.relu(self.shared(h)))

    analysis, report, _ = analyse(Twice(), torch.randn(5, 3))
    # Both uses of `shared` move its rows and columns: every ReLU site is tied into one class. The second call's
    # site is the module's path with its call index.
    scaling = [s for s in analysis.symmetries if s.group.name.startswith("PositiveScaling")]
    assert len(scaling) == 1 and scaling[0].members == ("inp", "shared", "shared#2")


def _traced_symmetry(middle, name, loss="mse"):
    model = nn.Sequential(nn.Linear(3, 4), middle, nn.Linear(4, 2)).double()
    analysis = symalg.derive(symalg.trace(model, (torch.randn(5, 3, dtype=torch.float64),)), loss=loss)
    symmetry = next(s for s in analysis.symmetries if s.group.name.startswith(name))
    return symmetry, {k: v.detach() for k, v in model.named_parameters()}


def _rotation(t):
    g = torch.eye(4, dtype=torch.float64)
    g[:2, :2] = torch.tensor([[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]], dtype=torch.float64)
    return g


_EYE = torch.eye(4, dtype=torch.float64)


@pytest.mark.parametrize("middle, group, g, problem", [
    (nn.ReLU(), "PositiveScaling", torch.tensor([0.0, 1, 1, 1], dtype=torch.float64), "entries must be positive"),
    (nn.ReLU(), "PositiveScaling", torch.tensor([-1.0, 1, 1, 1], dtype=torch.float64), "entries must be positive"),
    (nn.ReLU(), "PositiveScaling", torch.ones(3, dtype=torch.float64), r"h = 4, got \(3,\)"),
    (nn.ReLU(), "PositiveScaling", torch.tensor([float("inf"), 1, 1, 1], dtype=torch.float64), "non-finite"),
    (nn.Identity(), "GL", torch.diag(torch.tensor([1.0, 1, 1, 0], dtype=torch.float64)), "singular"),
    (nn.Identity(), "GL", torch.full((4, 4), float("nan"), dtype=torch.float64), "non-finite"),
    (nn.RMSNorm(4, elementwise_affine=False), "O(4)", 2 * _EYE, "gᵀg ≠ I"),
    (nn.LayerNorm(4, elementwise_affine=False), "O(4)_1", _rotation(0.3), "g 1 ≠ 1"),
    (nn.Tanh(), "SignFlips", torch.diag(torch.tensor([-1.0, 1, 2, 1], dtype=torch.float64)), "entries ±1"),
    (nn.Tanh(), "S(4)", _EYE[[1, 0, 2, 3]] * 0.5 + 0.5 * _EYE, "permutation matrix"),
    (nn.Tanh(), "S(4)", _EYE[:3, :3], r"h = 4, got \(3, 3\)"),
    (nn.Tanh(), "Translations", torch.ones(4, dtype=torch.float64), r"vector of length 5, got \(4,\)"),
    (nn.Tanh(), "Translations", torch.tensor([1.0, 1, 1, 1, float("nan")], dtype=torch.float64), "non-finite"),
], ids=["PS-zero", "PS-negative", "PS-length", "PS-inf", "GL-singular", "GL-nan", "O-not-orthogonal",
        "O1-moves-ones", "SF-not-pm1", "S-not-permutation", "S-shape", "T1-length", "T1-nan"])
def test_traced_apply_refuses_what_is_not_a_group_element_naming_the_group(middle, group, g, problem):
    symmetry, params = _traced_symmetry(middle, group, loss="cross_entropy")
    with pytest.raises(ValueError, match=problem) as error:
        symmetry.apply(params, g)
    assert str(error.value).startswith(symmetry.group.name)


def test_traced_apply_algebra_refuses_what_is_not_in_the_lie_algebra():
    symmetry, params = _traced_symmetry(nn.RMSNorm(4, elementwise_affine=False), "O(4)")
    with pytest.raises(ValueError, match=r"O\(4\): not in the Lie algebra: M is not antisymmetric"):
        symmetry.apply_algebra(params, _EYE)
    M = torch.zeros(4, 4, dtype=torch.float64)
    M[0, 1], M[1, 0] = 1, -1                            # antisymmetric: accepted, a rotation in the (0, 1) plane
    moved = symmetry.apply_algebra(params, M)
    changed = [t for t in symmetry.tensors if not torch.equal(moved[t], params[t])]
    assert changed and all(torch.isfinite(moved[t]).all() for t in changed)
