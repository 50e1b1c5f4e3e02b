"""Issue 57, item 3: a plan's printed band compares its point with the calibration rows of the
same MoE routing and slice count (planner/prediction/band.py's likeness): the plan states both, read from the
model it compiles (`model.decoders.experts.moe_routing`) and the slice it plans for."""

from __future__ import annotations

import torch

from tpu_tuner.model.decoders.experts import moe_routing
from tpu_tuner.model.workloads.loader import load_workload

BASE = "decoder:vocab=256,d_model=32,layers=1,heads=4,mlp=48"


def _routing(spec: str) -> str:
    with torch.device("meta"):
        return moe_routing(load_workload(spec).build_model())


def test_the_routing_is_read_from_the_model() -> None:
    assert _routing(BASE) == "dense"
    assert _routing(BASE + ",experts=4,top_k=2") == "dropping"
    assert _routing(BASE + ",experts=4,top_k=2,moe_routing=dropless") == "dropless"


def test_a_module_holding_experts_reads_dropless() -> None:
    class SparseBlock(torch.nn.Module):  # as transformers' MoE blocks hold their experts
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])

    assert moe_routing(torch.nn.Sequential(SparseBlock())) == "dropless"
