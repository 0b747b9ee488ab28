"""A GPT-style pre-norm transformer block, for ``symalg --model examples/gpt_block.py``.

Defines ``model`` and ``example_inputs``; the CLI traces it with torch.fx, prints every symmetry
(per-head GL(d_k) on queries/keys, GL(d_v) on values/outputs, head permutations, the diagonal
symmetries of the LayerNorm gains, ...), what was blocked and by which node, and verifies them.
A ``torch.cumsum`` in the MLP is an op the catalogue does not know: it blocks that site.
"""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.fc2(torch.cumsum(F.relu(self.fc1(self.ln2(x))), dim=-1))


torch.manual_seed(0)
model = Block().double()
example_inputs = (torch.randn(2, 5, 8, dtype=torch.float64),)
