"""Attention variants: score modifiers (masks, biases, temperatures) and the key bias's translations."""
import pytest
import torch
from torch import nn

import symalg
from symalg.verification.certification import claim_errors

B, L, D, H = 2, 5, 8, 2


class Scored(nn.Module):
    """``o(softmax(scores(net, Q Kᵀ / 2)) V)`` with ``H`` heads; ``q, k, v, o`` biased linears."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores
        self.q, self.k, self.v, self.o = (nn.Linear(D, D) for _ in range(4))
        self.temperature = nn.Parameter(torch.tensor(1.7))
        self.per_key = nn.Parameter(torch.rand(1, L) + 0.5)
        self.bias = nn.Parameter(torch.randn(H, L, L))
        self.register_buffer("causal", torch.ones(L, L, dtype=torch.bool).triu(1))

    def forward(self, x):
        q, k, v = (f(x).view(B, L, H, D // H).transpose(1, 2) for f in (self.q, self.k, self.v))
        scores = self.scores(self, q @ k.transpose(-2, -1) / 2)
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D))


def _x():
    return torch.randn(B, L, D, dtype=torch.float64)


def _claims(model):
    analysis = symalg.derive(symalg.from_torch(model.double(), (_x(),)), certify=False)
    return analysis, {s.label.split(" on ")[0].split("(")[0] + " on " + s.label.split(" on ")[1]
                      for s in analysis.symmetries}


def _key_shift_error(model):
    """Relative output change when every key bias entry moves by 0.8 (what ``T`` on the ``qk`` sites claims)."""
    x = _x()
    before = model(x)
    with torch.no_grad():
        model.k.bias += 0.8
    return ((model(x) - before).norm() / before.norm()).item()


PER_HEAD = {"GL on q.head0.qk", "GL on q.head1.qk", "GL on q.head0.vo", "GL on q.head1.vo",
            "Shears on q.head0.vo", "Shears on q.head1.vo"}   # each value bias into o's bias: rows sum to 1
KEY_SHIFTS = {"Translations on q.head0.qk", "Translations on q.head1.qk"}


@pytest.mark.parametrize("scores, heads_alike, key_shifts", [
    (lambda net, s: s, True, True),
    (lambda net, s: s * net.temperature, True, True),                                # learnable temperature
    (lambda net, s: s.masked_fill(net.causal, float("-inf")), True, True),           # causal mask
    (lambda net, s: (s + net.bias).masked_fill(net.causal, float("-inf")), False, True),  # T5-style bias per head
    (lambda net, s: s + net.bias[:1], True, True),                                   # one bias for all heads
    (lambda net, s: s.masked_fill(net.causal, -3.0), True, False),                   # finite fill
    (lambda net, s: s * net.per_key, True, False),                                   # factor varying along keys
])
def test_score_modifiers_keep_the_per_head_groups_and_claim_exactly_what_holds(scores, heads_alike, key_shifts):
    torch.manual_seed(0)
    model = Scored(scores).double()
    analysis, claims = _claims(model)
    expected = PER_HEAD | (KEY_SHIFTS if key_shifts else set()) | ({"S on q.heads"} if heads_alike else set())
    assert claims == expected
    errors = claim_errors(analysis)
    assert max(e.error for e in errors) < 1e-12
    # the refusals are needed: what is not claimed does change the output
    shift = _key_shift_error(model)
    assert shift < 1e-12 if key_shifts else shift > 1e-3
    if not heads_alike:
        assert any("differs between heads" in b.reason for b in analysis.sites.restrictions)


def test_the_key_bias_is_conserved_and_its_gradient_vanishes():
    torch.manual_seed(1)
    model = Scored(lambda net, s: s * net.temperature).double()
    analysis, _ = _claims(model)
    report = symalg.verify(analysis)
    assert report.passed
    x = _x()
    model(x).square().sum().backward()
    assert model.k.bias.grad.abs().max() < 1e-13 < model.q.bias.grad.abs().max()


def test_multihead_attention_key_bias_translates_per_head():
    torch.manual_seed(2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.out = nn.Linear(3, D), nn.Linear(D, 2)
            self.attention = nn.MultiheadAttention(D, H, batch_first=True)

        def forward(self, x):
            h = self.inp(x)
            return self.out(self.attention(h, h, h, need_weights=False)[0])

    net = Net().double()
    analysis = symalg.derive(symalg.from_torch(net, (torch.randn(B, L, 3, dtype=torch.float64),)), certify=False)
    translations = [s for s in analysis.symmetries if s.label.startswith("Translations")]
    assert sorted(s.label for s in translations) == ["Translations(4, bias) on attention.head0.qk",
                                                     "Translations(4, bias) on attention.head1.qk"]
    assert max(e.error for e in claim_errors(analysis, symmetries=translations)) < 1e-12
    assert "in_proj_bias[8:12]" in str(translations[0]) and "in_proj_bias[12:16]" in str(translations[1])


class Packed(nn.Module):
    """One ``qkv`` linear to ``3d`` cut into ``q, k, v`` by ``cut``; ``leak`` also returns the query piece."""

    def __init__(self, cut, leak=False):
        super().__init__()
        self.cut, self.leak = cut, leak
        self.qkv, self.o = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        pieces = self.cut(self.qkv(x))
        q, k, v = (pieces[i].view(B, L, H, D // H).transpose(1, 2) for i in range(3))
        y = self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D))
        return (y, pieces[0]) if self.leak else y


@pytest.mark.parametrize("cut", [lambda h: h.split(D, -1), lambda h: h.chunk(3, dim=-1),
                                 lambda h: torch.split(h, [D, D, D], -1)], ids=["split", "chunk", "torch.split"])
def test_packed_qkv_cut_by_split_or_chunk_has_the_per_head_groups(cut):
    torch.manual_seed(3)
    analysis = symalg.derive(symalg.from_torch(Packed(cut).double(), (_x(),)), certify=False)
    assert {s.label for s in analysis.symmetries} == (
        {f"GL(4) on qkv.head{h}.{p}" for h in (0, 1) for p in ("qk", "vo")} | {"S(2) on qkv.heads"} |
        {f"Translations(4, bias) on qkv.head{h}.qk" for h in (0, 1)} | {f"Shears(4) on qkv.head{h}.vo" for h in (0, 1)})
    # head 1's query rows are rows 4:8 of the packed weight, its key rows 12:16, its value rows 20:24
    qk = next(s for s in analysis.symmetries if s.label == "GL(4) on qkv.head1.qk")
    assert "qkv.weight rows[4:8] (out)" in str(qk) and "qkv.weight rows[12:16] (in)" in str(qk)
    assert max(e.error for e in claim_errors(analysis)) < 1e-12


def test_a_packed_piece_read_elsewhere_keeps_its_rows_fixed():
    torch.manual_seed(4)
    model = Packed(lambda h: h.chunk(3, -1), leak=True).double()
    analysis = symalg.derive(symalg.from_torch(model, (_x(),)), certify=False)
    assert not any("head" in s.site for s in analysis.symmetries)
    assert any("attention" in b.reason for b in analysis.blocked)
    assert all(e.holds for e in claim_errors(analysis))


def test_a_split_cutting_a_shared_site_apart_claims_nothing_there():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.a, self.b = nn.Linear(3, 4), nn.Linear(2, 2), nn.Linear(4, 2)

        def forward(self, x):
            h = torch.relu(self.fc(x))        # a ReLU site read by the split and by b: it cannot be cut in two
            first, _ = h.split(2, -1)
            return self.a(first) + self.b(h)

    analysis = symalg.derive(symalg.from_torch(Net().double(), (torch.randn(5, 3, dtype=torch.float64),)),
                             certify=False)
    assert not any(s.site == "fc" for s in analysis.symmetries)
    assert any("cuts the site's coordinates apart" in b.reason for b in analysis.blocked)


class Grouped(nn.Module):
    """Grouped-query attention: 4 query heads, 2 key/value heads of width 2, repeated by ``repeat``."""

    def __init__(self, repeat):
        super().__init__()
        self.repeat = repeat
        self.q, self.k, self.v, self.o = nn.Linear(6, 8), nn.Linear(6, 4), nn.Linear(6, 4), nn.Linear(8, 6)

    def forward(self, x):
        q = self.q(x).view(B, L, 4, 2).transpose(1, 2)
        k, v = (self.repeat(f(x).view(B, L, 2, 2).transpose(1, 2)) for f in (self.k, self.v))
        return self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, 8))


@pytest.mark.parametrize("repeat", [
    lambda t: t.repeat_interleave(2, dim=1),
    lambda t: t[:, :, None, :, :].expand(B, 2, 2, L, 2).reshape(B, 4, L, 2),   # Hugging Face's repeat_kv
], ids=["repeat_interleave", "expand"])
def test_grouped_query_attention_has_one_group_per_key_value_head(repeat):
    torch.manual_seed(5)
    model = Grouped(repeat).double()
    analysis = symalg.derive(symalg.from_torch(model, (torch.randn(B, L, 6, dtype=torch.float64),)),
                             certify=False)
    assert {s.label for s in analysis.symmetries} == (
        {f"GL(2) on q.group{g}.{p}" for g in (0, 1) for p in ("qk", "vo")} |
        {"S(2) on q.groups", "S(2) on q.group0.heads", "S(2) on q.group1.heads"} |
        {f"Translations(2, bias) on q.group{g}.qk" for g in (0, 1)} | {f"Shears(2) on q.group{g}.vo" for g in (0, 1)})
    # each value head's bias moves into o's bias through the columns of both query heads reading it
    value = next(s for s in analysis.symmetries if s.label == "Shears(2) on q.group1.vo")
    assert all(f"o.bias absorbs −o.weight columns[{a}:{b}] (in) t" in str(value) for a, b in ((4, 6), (6, 8)))
    # group 1's GL(d_k): query heads 2 and 3 (rows 4:8) and key head 1 (rows 2:4)
    qk = next(s for s in analysis.symmetries if s.label == "GL(2) on q.group1.qk")
    assert all(f"{region}" in str(qk) for region in ("q.weight rows[4:6] (out)", "q.weight rows[6:8] (out)",
                                                     "k.weight rows[2:4] (in)"))
    assert max(e.error for e in claim_errors(analysis)) < 1e-12
    # a per-head GL(d_k) (query head 2 alone with key head 1) would not hold: the groups are as large as they must be
    g = torch.randn(2, 2, dtype=torch.float64) + 2 * torch.eye(2, dtype=torch.float64)
    x = torch.randn(B, L, 6, dtype=torch.float64)
    before = model(x)
    with torch.no_grad():
        model.q.weight[4:6] = g @ model.q.weight[4:6]
        model.q.bias[4:6] = g @ model.q.bias[4:6]
        model.k.weight[2:4] = torch.linalg.inv(g).T @ model.k.weight[2:4]
        model.k.bias[2:4] = torch.linalg.inv(g).T @ model.k.bias[2:4]
    assert ((model(x) - before).norm() / before.norm()).item() > 1e-3


def test_hugging_face_t5_attention_with_its_relative_position_bias():
    """T5's per-head relative-position bias is added to the scores: the per-head GL(d_k), GL(d_v) hold, the head
    permutation does not (each head has its own bias)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    config = transformers.T5Config(d_model=D, d_kv=D // H, num_heads=H, relative_attention_num_buckets=8,
                                   dropout_rate=0.0)

    class Wrapped(nn.Module):   # T5Attention returns (output, position bias, weights): keep the output
        def __init__(self):
            super().__init__()
            self.attn = T5Attention(config, has_relative_attention_bias=True)

        def forward(self, x):
            return self.attn(x)[0]

    torch.manual_seed(6)
    model = Wrapped().double().eval()
    analysis = symalg.derive(symalg.from_torch(model, (_x(),)), certify=False)
    assert {s.label for s in analysis.symmetries} == {f"GL(4) on attn.head{h}.{p}"
                                                      for h in (0, 1) for p in ("qk", "vo")}
    assert max(e.error for e in claim_errors(analysis)) < 1e-12
    assert any(r.site == "attn.heads" and "differs between heads" in r.reason for r in analysis.sites.restrictions)
    # the refusal is needed: swapping the two heads (q, k, v rows and o columns) changes the output
    x = _x()
    before = model(x)
    swap = torch.cat([torch.arange(4, 8), torch.arange(0, 4)])
    with torch.no_grad():
        for layer in (model.attn.q, model.attn.k, model.attn.v):
            layer.weight.copy_(layer.weight[swap])
        model.attn.o.weight.copy_(model.attn.o.weight[:, swap])
    assert ((model(x) - before).norm() / before.norm()).item() > 1e-3
