"""The two 2023 v4 rows' memory under the recipe choices that differ from today's MaxText
(issue 29: why the planner refused v4 22B at pdb 16; docs/planner.md, "Calibration").

MaxText published its v4 table (22B on v4-128, 52B on v4-384) in March / April 2023, when its
base.yml trained at max_target_length 1024 and its layers ran dot-product attention (flash came
with 5b0e28e, 2023-09-06, which also raised the default sequence to 2048). Each variant here is
one full-effort compile of the row's training step, in this process, for its real megacore
topology, and prints the compiler's memory figures and the verdict:

    python benchmarks/planner/v4_2023_recipe.py [--rows v4-synthetic-22b-v4-128 ...] [--variants seq2048-flash ...]

Variants: `seq2048-flash` (the row as it stood before issue 29's fix), `seq1024-flash` (as the
planner compiles it now), `seq1024-dot` (the planner's textbook attention instead of the flash
kernel: fp32 scores materialised per block, as a dot-product attention does; a sensitivity check,
not what the planner compiles, since 2023's layers were not the generic decoder's either).
"""

from __future__ import annotations

import argparse

from published_calibration import load_runs, row_of

ROWS = ("v4-synthetic-22b-v4-128", "v4-synthetic-52b-v4-384")
VARIANTS = {"seq2048-flash": (2048, True), "seq1024-flash": (1024, True), "seq1024-dot": (1024, False)}


def compile_variant(run: dict, seq: int, use_flash: bool) -> str:
    """One line: the row's step compiled at `seq` with the flash kernel or the textbook attention."""
    from tpu_tuner.planner.compiler import program
    from tpu_tuner.planner.compiler.compile_pool import _workload
    from tpu_tuner.planner.compiler.compile_request import (
        CompileJob,
        CompileModel,
        CompileTarget,
        StepSettings,
        topology_devices,
    )
    from tpu_tuner.planner.compiler.hbm import compiler_hbm_limit
    from tpu_tuner.planner.compiler.step_parts import sharded_attention
    from tpu_tuner.planner.plans.plan_space import PlanPoint
    from tpu_tuner.planner.topology import parse_topology

    row = row_of({**run, "seq": seq})
    topology = parse_topology(row.topology)
    devices = topology_devices(topology.jax_name)

    # The planner picks the kernel by platform (flash on a TPU); the dot-product variant asks the
    # CPU cross-check's kernel on the TPU topology instead.
    def attention(env: object, mesh: object, flash: bool, flash_block: int | None = None) -> None:
        sharded_attention(env, mesh, flash=flash and use_flash, flash_block=flash_block)

    program.sharded_attention = attention
    workload = _workload(row.spec)
    job = CompileJob(
        CompileModel(row.spec, None, run["d_model"], run["layers"], scan=True),
        CompileTarget(topology.jax_name),
        StepSettings(row.global_batch, seq, first_moment_dtype=row.mu_dtype or "float32"),  # unused without moments
        PlanPoint(row.layout, row.remat),
    )
    step = program.compile_step(job, lambda: workload.model_for_preset(None), devices)
    limit = compiler_hbm_limit(devices[0])
    gib = 2**30
    name = f"{row.id} seq {seq} {'flash' if use_flash else 'dot-product'}"
    if step.error:
        return f"{name}: refused: {step.error} ({step.compile_seconds:.0f} s)"
    return (
        f"{name}: peak {step.peak_bytes / gib:.2f} / {limit / gib:.2f} GiB (arguments "
        f"{step.argument_bytes / gib:.2f}, temporaries {step.temp_bytes / gib:.2f}), margin "
        f"{(limit - step.peak_bytes) / gib:.2f} GiB ({step.compile_seconds:.0f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    runs = {run["id"]: run for run in load_runs()}
    for row_id in args.rows:
        for variant in args.variants:
            print(compile_variant(runs[row_id], *VARIANTS[variant]), flush=True)


if __name__ == "__main__":
    main()
