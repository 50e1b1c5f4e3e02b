"""What every rank of a sharded run sets up the same way: join the process group, load the model
file, build the model and the global batch from fixed seeds (so every rank, and the reference,
holds the same weights and data), refuse a layout the model cannot run, and find this rank's
slice of the batch."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from tpu_tuner.model.layouts import Layout
from tpu_tuner.runner.launch import init_rank

SEED = 0


@dataclass
class RankStep:
    """One rank's model (not yet sharded), the global batch and its own slice of it."""

    rank: int
    world: int
    layout: Layout
    workload: Any  # tpu_tuner.model.workload.Workload
    model: Any  # nn.Module, built from SEED
    inputs: Any
    target: Any
    local_inputs: Any
    local_target: Any

    @property
    def local_batch(self) -> int:
        return len(self.local_target)


def rank_arguments(description: str) -> argparse.ArgumentParser:
    """The command line every rank program takes: MODEL.py LAYOUT [--batch-size N]."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model_file")
    parser.add_argument("layout", help="DATAxFSDPxTENSOR, or a config .toml with [sharding.mesh]")
    parser.add_argument("--batch-size", type=int)
    return parser


def layout_of(text: str) -> Layout:
    """A layout string, or the [sharding.mesh] of a tuned / planned config file."""
    from tpu_tuner.parallel.apply import parse_layout

    if not text.endswith(".toml"):
        return parse_layout(text)
    from tpu_tuner.knobs.tuned_config import TunedConfig

    return parse_layout(TunedConfig.load(text).candidate["layout"])


def prepare_rank_step(model_file: str, layout_text: str, batch_size: int | None) -> RankStep:
    """Join the group and build this rank's step inputs; exits with the reason when the file
    has no training step or the layout cannot run the model."""
    import torch

    from tpu_tuner.model.loader import load_workload
    from tpu_tuner.parallel.apply import batch_shard, why_not

    rank, world = init_rank()
    layout = layout_of(layout_text)
    workload = load_workload(model_file)
    if not workload.is_training:
        raise SystemExit(f"{model_file}: a sharded run needs a training step (the file declares no loss)")
    torch.manual_seed(SEED)
    model = workload.build_model()
    batch = batch_size or workload.batch_size or 8
    reason = why_not(model, layout, world, batch)
    if reason:
        raise SystemExit(f"layout {layout_text}: {reason}")
    torch.manual_seed(SEED + 1)
    inputs, target = workload.split_batch(workload.batch(batch))
    size = batch // layout.batch_shards
    shard = batch_shard(layout, rank)
    local_inputs, local_target = (t[shard * size:(shard + 1) * size] for t in (inputs, target))
    return RankStep(rank, world, layout, workload, model, inputs, target, local_inputs, local_target)
