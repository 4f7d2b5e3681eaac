import torch, torch.nn as nn
from torchref.render import forward_blocks

class Block(nn.Module):  # your block: (B, T, D) -> (B, T, D), with a mask, positions and dropout
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(0.1))
    def forward(self, x, mask, *, pos):
        h = self.ln1(x + pos)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))

torch.manual_seed(0)
blocks = nn.ModuleList(Block() for _ in range(16))
x, pos = torch.randn(4, 10, 32), torch.randn(10, 32)
mask = torch.triu(torch.ones(10, 10, dtype=torch.bool), diagonal=1)  # causal: True = masked

def grads(plan):
    blocks.zero_grad()
    torch.manual_seed(1)  # the same dropout masks for each plan
    forward_blocks(blocks, x, plan, mask, pos=pos).square().mean().backward()  # mask, pos go to every block
    return [p.grad.view(torch.int32).clone() for p in blocks.parameters()]

g_none, g_sqrt = grads("none"), grads("sqrt+save_dots")  # a schedule, or a plan SCHEDULE+POLICY
print(all(torch.equal(a, b) for a, b in zip(g_none, g_sqrt)))  # True: the same bits, the same masks
