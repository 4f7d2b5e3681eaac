import torch
from torchref import plan_blocks

torch.manual_seed(0)
blocks = [torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)) for _ in range(16)]
fit = plan_blocks(blocks, torch.ones(32, 64), budget="50%")
print(fit.plan.name, fit.peak_bytes <= fit.budget_bytes, fit.grads_bitwise_equal)
