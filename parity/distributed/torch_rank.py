"""What one PyTorch rank runs for :mod:`parity.distributed.torch_worker` (inside an initialised process group).

Every rank calls the same methods in the same order (the gathers are collectives); only rank 0
computes the single-process references and builds the rows.
"""

from __future__ import annotations

# Deferred imports: safetensors loads only on rank 0, when it writes ``none``'s gradients.

from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from torchref.distributed import PlanLoss, full_params, fully_shard_model, replicate_model
from torchref.model import GPT
from torchref.render import model_loss

from parity.checks.compare import compare_bitwise
from parity.distributed.result import DeviceMemory, DistributedRow, grads_file_name
from parity.distributed.torch_memory import predict, rank_memory, single_activation_bytes
from parity.inputs.presets import get_preset
from parity.inputs.pretrained import preset_inputs
from parity.inputs.train import AdamWConfig
from parity.runners.torch_runner import adamw

REFERENCE = "mean of the per-shard single-device gradients (rank order, / W)"


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().numpy().tobytes()


class RankRun:
    """One rank's inputs and its share of the work.

    Args:
        rank: this rank; world: ranks W; preset_name / dtype / seed: the single-device harness's
        inputs (:func:`parity.inputs.pretrained.preset_inputs`); hparams: AdamW settings;
        on_cuda: run on ``cuda:rank`` (NCCL) instead of the CPU (gloo).
    """

    def __init__(self, rank: int, world: int, preset_name: str, dtype: str, seed: int, hparams: AdamWConfig,
                 on_cuda: bool):
        self.rank, self.world, self.seed, self.hparams, self.on_cuda = rank, world, seed, hparams, on_cuda
        self.device = torch.device("cuda", rank) if on_cuda else torch.device("cpu")
        self.cfg, self.params, tokens = preset_inputs(get_preset(preset_name), dtype, seed)
        self.tokens = torch.from_numpy(np.array(tokens, dtype=np.int64, order="C"))
        per = self.tokens.shape[0] // world
        self.shards = [self.tokens[r * per:(r + 1) * per] for r in range(world)]
        self.mine = self.shards[rank].to(self.device)
        self.mesh = init_device_mesh(self.device.type, (world,))
        self._reference: Optional[dict] = None
        self._summary: dict = {}
        self._single_act: dict[str, int] = {}
        self.param_bytes = sum(int(a.nbytes) for a in self.params.values())
        self.layer_bytes = sum(int(a.nbytes) for k, a in self.params.items() if k.startswith("h.")) // self.cfg.n_layer
        self.root_bytes = sum(int(a.nbytes) for k, a in self.params.items() if not k.startswith("h."))

    # ------------------------------------------------------------------ single process (rank 0)
    def _plain(self, tokens: torch.Tensor, plan: str = "none") -> dict[str, np.ndarray]:
        model = GPT.from_params(self.cfg, self.params)
        torch.manual_seed(self.seed)
        model_loss(model, tokens, plan).backward()
        return model.to_params(grads=True)

    def reference(self) -> dict[str, np.ndarray]:
        """The mean of the per-shard single-device gradients; also measures the full-batch gradient's distance."""
        if self._reference is None:
            per_shard = [self._plain(s) for s in self.shards]
            mean = {k: sum((g[k] for g in per_shard[1:]), per_shard[0][k]) / np.asarray(self.world, per_shard[0][k].dtype)
                    for k in per_shard[0]}
            full = compare_bitwise(self._plain(self.tokens), mean)
            self._summary = {"reference": REFERENCE, "world_size": self.world,
                             "full_batch_vs_reference": {"bitwise": full.equal, "max_ulp": full.max_ulp,
                                                         "max_abs": full.max_abs_diff,
                                                         "mismatched": len(full.mismatched), "tensors": len(mean)}}
            self._reference = mean
        return self._reference

    def single_activation(self, plan: str, grads_resident: bool = False) -> int:
        """Single-device peak activation bytes of one full-batch step under ``plan`` (MemTracker).

        ``grads_resident``: the gradients stay allocated from step to step (``zero_grad(set_to_none=False)``),
        as DDP's are (views of its buckets, allocated when DDP is built); else they are allocated as the
        backward pass produces them, as FSDP2's sharded gradients are. The two differ under remat:
        with lazy gradients the step's peak falls late in the backward pass, where many gradients
        exist and many activations are freed; with resident ones it falls where the activations peak
        (gpt-small ``full``: 1,714,216 vs 2,238,504 bytes; docs/sharding-torch.md).
        """
        key = f"{plan} (gradients resident)" if grads_resident else plan
        if key not in self._single_act:
            model = GPT.from_params(self.cfg, self.params)
            opt = adamw(model.parameters(), self.hparams)

            def step():
                opt.zero_grad(set_to_none=not grads_resident)
                model_loss(model, self.tokens, plan).backward()
                opt.step()

            step()
            self._single_act[key] = single_activation_bytes(step, model, opt)
        return self._single_act[key]

    def reference_summary(self) -> dict:
        """What :meth:`reference` measured, JSON-ready (rank 0)."""
        return dict(self._summary, single_activation_bytes=dict(self._single_act))

    # ------------------------------------------------------------------ distributed (every rank)
    def _wrap(self, layout: str) -> torch.nn.Module:
        module = PlanLoss(GPT.from_params(self.cfg, self.params).to(self.device))
        return fully_shard_model(module, self.mesh) if layout == "fully_sharded" else replicate_model(module)

    def _grads(self, layout: str, plan: str) -> tuple[torch.Tensor, float, dict[str, np.ndarray]]:
        module = self._wrap(layout)
        torch.manual_seed(self.seed)
        loss = module(self.mine, plan)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)  # SUM: the global loss is the mean of the W shard means
        return loss.detach(), float(total) / self.world, full_params(module, grads=True)

    def _train(self, layout: str, plan: str) -> tuple[dict[str, np.ndarray], DeviceMemory]:
        module = self._wrap(layout)
        opt = adamw(module.parameters(), self.hparams)

        def step():
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(self.seed)
            module(self.mine, plan).backward()
            opt.step()

        if self.hparams.steps < 2:
            raise ValueError(f"the trained-weights check needs hparams.steps >= 2 (the last is measured), "
                             f"got {self.hparams.steps}")
        for _ in range(self.hparams.steps - 1):
            step()
        act = self.single_activation(plan, grads_resident=layout == "data_parallel") if self.rank == 0 else None
        memory = rank_memory(step, module, opt, rank=self.rank, on_cuda=self.on_cuda,
                             predicted=predict(self.param_bytes, act, self.world, layout,
                                               layer_bytes=self.layer_bytes, root_bytes=self.root_bytes))
        return full_params(module), memory

    def _agree(self, same: bool) -> bool:
        """True on every rank when ``same`` holds on every rank (all-reduce MIN)."""
        flag = torch.tensor([1 if same else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def run_mesh(self, mesh: str, layout: str, plans: tuple[str, ...], out_dir: str) -> list[DistributedRow]:
        """Rows of every plan on one mesh (``none`` first; rank 0's rows, empty list elsewhere)."""
        rows: list[DistributedRow] = []
        base: Optional[tuple] = None
        for plan in plans:
            local_loss, loss, grads = self._grads(layout, plan)
            if plan == "none":  # the baseline; its row compares a second run (determinism)
                base_loss, _, base_grads = local_loss, loss, grads
                local_loss, loss, grads = self._grads(layout, plan)
            else:
                base_loss, base_grads = base[0], base[1]
            loss_same = self._agree(_bits(local_loss) == _bits(base_loss))
            trained, memory = self._train(layout, plan)
            if plan == "none":  # trained twice too: the second run is the row's, the first the baseline
                base = (base_loss, base_grads, trained)
                trained, memory = self._train(layout, plan)
            if self.rank == 0:
                rows.append(self._row(mesh, layout, plan, loss, loss_same, grads, trained, memory, base, out_dir))
        return rows

    def _row(self, mesh, layout, plan, loss, loss_same, grads, trained, memory, base, out_dir) -> DistributedRow:
        g = compare_bitwise(grads, base[1])
        w = compare_bitwise(trained, base[2])
        ref = compare_bitwise(grads, self.reference())
        grads_file = None
        if plan == "none":
            from safetensors.numpy import save_file

            grads_file = str(Path(out_dir) / grads_file_name("torch", mesh))
            save_file(grads, grads_file)
        ok = g.equal and w.equal and loss_same and ref.equal
        full = self._summary["full_batch_vs_reference"]
        return DistributedRow(
            framework="torch", mesh=mesh, layout=layout, devices=self.world, processes=self.world, plan=plan,
            status="pass" if ok else "fail", loss=loss, grads_bitwise=g.equal, weights_bitwise=w.equal,
            max_ulp=g.max_ulp, exception=None,
            reference=f"{REFERENCE}; the full-batch gradient differs by max abs {full['max_abs']:.3g} "
                      f"({full['max_ulp']} ULP) in {full['mismatched']}/{full['tensors']} tensors (summation order)",
            reference_ok=ref.equal, reference_err=ref.max_abs_diff, memory=memory, grads_file=grads_file)

