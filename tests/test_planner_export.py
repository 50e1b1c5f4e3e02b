"""The planned step serialized by jax.export (program.compile_step's export_to): the program a
machine with the chip runs in benchmarks/chip/tpu_chip_check.py must be the planner's training step."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from helpers.tiny_planner import TINY, needs_planner, planner_env


@needs_planner
@pytest.mark.slow  # a compile of the tiny decoder in a fresh interpreter: about 15 s here
def test_the_exported_step_is_the_planned_training_step(tmp_path: object) -> None:
    code = f"""
        import json, math
        import jax, jax.numpy as jnp, numpy as np
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.plans.hf_plan import planned_workload
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint

        workload = planned_workload({TINY!r})
        path = {str(tmp_path)!r} + "/step.jaxexport"
        job = CompileJob(CompileModel({TINY!r}, None, 128, 2, scan=True), CompileTarget("cpu"), StepSettings(4, 64),
                         PlanPoint(Layout(1, 1, 1)), export_to=path)
        step = compile_step(job, lambda: workload.model_for_preset(None), jax.devices("cpu")[:1])
        assert step.error is None, step.error
        exported = jax.export.deserialize(bytearray(open(path, "rb").read()))
        (params, state, buffers, tokens, _), _ = jax.tree.unflatten(exported.in_tree, exported.in_avals)
        rng = np.random.default_rng(0)
        init = lambda a: jnp.asarray(rng.normal(0, 0.02, a.shape), a.dtype)
        params, buffers = jax.tree.map(init, params), jax.tree.map(init, buffers)
        state = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), state)
        batch = jnp.asarray(rng.integers(0, 256, tokens.shape), tokens.dtype)
        losses = []
        for _ in range(5):
            params, state, loss = exported.call(params, state, buffers, batch, batch)
            losses.append(float(loss))
        print(json.dumps({{"parameters": sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params)),
                          "platforms": list(exported.platforms), "losses": losses}}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=900, env=planner_env()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Embedding and head 256 x 128, two blocks of q/k/v/o 128 x 128 and gate/up/down 128 x 256, two
    # RMSNorm weights a block and the final one: the whole model, weights stacked for the scan.
    assert out["parameters"] == 2 * 256 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 256 + 2 * 128) + 128
    assert out["platforms"] == ["cpu"]
    losses = out["losses"]
    assert losses[0] == pytest.approx(math.log(256), abs=0.05)  # small random weights: near-uniform logits
    assert losses[-1] < losses[0]  # the optimizer's update is in the program: the same batch's loss falls
