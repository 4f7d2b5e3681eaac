import torch, torch.nn as nn
from torchref.render import forward_blocks

torch.manual_seed(0)
blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Dropout(0.1), nn.Linear(128, 32)) for _ in range(16))
x = torch.randn(4, 10, 32)
def grads(plan):
    blocks.zero_grad()
    torch.manual_seed(1)  # the same dropout masks for each plan
    forward_blocks(blocks, x, plan).square().mean().backward()  # extra args and kwargs go to every block
    return [p.grad.view(torch.int32).clone() for p in blocks.parameters()]
print(all(torch.equal(a, b) for a, b in zip(grads("none"), grads("sqrt+save_dots"))))  # True: same bits, same masks
