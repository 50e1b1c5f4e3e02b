"""The planner's joint space and its Optuna search, without the TPU compiler: remat policies by
MaxText's names, the block tensors they name, valid points, the HBM lower bound, and the search
loop (budget, pruning before compile, repeats, resume, the grid sampler, a study that plans something
else) against a scripted compiler."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers.tiny_planner import SEARCH_SPACE, ShapedPool, tiny_llama_problem

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.model.decoders.decoder import Decoder, DecoderShape
from tpu_tuner.model.meshes.layouts import Layout, ModelShape
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.structure import read_dims
from tpu_tuner.planner.compiler.compile_request import StepSettings
from tpu_tuner.planner.compiler.remat import block_tensor_roles, forward_flops_per_token, parse_remat
from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanSearch, PlanStore, PlanTarget
from tpu_tuner.planner.plans.plan_space import PlanPoint, PlanSpace, invalid_reason, memory_lower_bound, valid_points

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SHAPE = ModelShape(d_model=256, n_heads=8, n_kv_heads=2, mlp_hidden=768, vocab=4096, n_layers=4)


def test_named_policies_keep_what_maxtext_keeps() -> None:
    full, minimal = parse_remat("full"), parse_remat("minimal")
    assert all(full.action(t) == "remat" for t in ("decoder_layer_input", "query_proj", "mlpwo", "context"))
    assert minimal.action("mlpwi_0") == "device" and minimal.action("context") == "remat"
    qkv = parse_remat("save_qkv_proj")
    assert [qkv.action(t) for t in ("query_proj", "key_proj", "value_proj", "out_proj")] == ["device"] * 3 + ["remat"]
    except_mlpwi = parse_remat("save_dot_except_mlpwi")
    assert except_mlpwi.action("mlpwo") == "device" and except_mlpwi.action("mlpwi_1") == "remat"
    offloaded = parse_remat("qkv_proj_offloaded")
    assert offloaded.action("key_proj") == "offload" and offloaded.offloads
    assert parse_remat("minimal_offloaded").action("out_proj") == "offload"
    assert parse_remat("none").action("mlpwi_0") == "device"


def test_custom_policies_are_read_as_maxtext_writes_them() -> None:
    # The published Llama3.1-70B v6e-256 recipe: the block input and q / k / v in host memory.
    policy = parse_remat("custom:query_proj=offload,decoder_layer_input=offload,key_proj=offload,value_proj=offload")
    assert policy.name == "custom:decoder_layer_input=offload,query_proj=offload,key_proj=offload,value_proj=offload"
    assert policy.action("out_proj") == "remat" and policy.action("value_proj") == "offload"
    # TPU7x 70B: q / k / v and the attention's context kept on the device, out_proj recomputed.
    device = parse_remat("custom:decoder_layer_input=device,context=device,query_proj=device,out_proj=remat")
    assert device.action("context") == "device" and device.action("out_proj") == "remat" and not device.offloads
    assert parse_remat("offload").name == "custom:decoder_layer_input=offload"  # the planner's older name
    with pytest.raises(UserInputError, match="--remat.*unknown remat policy 'fulll'"):
        parse_remat("fulll")
    with pytest.raises(UserInputError, match="NAME=ACTION"):
        parse_remat("custom:query_proj=disk")


def test_jax_policies_are_built_for_every_named_policy() -> None:
    from tpu_tuner.planner.compiler.remat import NAMED_POLICIES

    for name in NAMED_POLICIES:
        assert callable(parse_remat(name).jax_policy()), name
    assert parse_remat("none").jax_policy() is None
    assert callable(parse_remat("custom:decoder_layer_input=offload,mlpwo=device").jax_policy())


@pytest.mark.parametrize("gated", [True, False])
def test_block_tensors_are_found_from_the_structure(gated: bool) -> None:
    shape = DecoderShape(
        vocab=512, d_model=128, layers=2, heads=4, kv_heads=4 if not gated else 2, mlp=384, gated=gated
    )
    with torch.device("meta"):
        model = Decoder(shape)
    roles, context_of = block_tensor_roles(model.layers[0], 128, 384)
    expected = {
        "attention.wq": "query_proj",
        "attention.wk": "key_proj",
        "attention.wv": "value_proj",
        "attention.wo": "out_proj",
        "feed_forward.w_down": "mlpwo",
    }
    expected.update(
        {"feed_forward.w_gate": "mlpwi_0", "feed_forward.w_up": "mlpwi_1"}
        if gated
        else {"feed_forward.w_up": "mlpwi_0"}
    )
    assert roles == expected
    assert context_of == ("attention.wo",)


def test_the_example_llama_block_is_named_too() -> None:
    workload = load_workload(EXAMPLES / "llama.py")
    with torch.device("meta"):
        model = workload.model_for_preset("tiny")
    dims = read_dims(model)
    roles, _ = block_tensor_roles(model.layers[0], dims.shape.d_model, dims.shape.mlp_hidden)
    assert sorted(roles.values()) == sorted(
        ["query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo"]
    )


def test_recomputed_work_follows_the_policy() -> None:
    args = (256, 8, 2, 32, 768, True, 128)
    total, full = forward_flops_per_token(parse_remat("full"), *args)
    assert full == total
    assert forward_flops_per_token(parse_remat("none"), *args)[1] == 0
    _, minimal = forward_flops_per_token(parse_remat("minimal"), *args)
    assert minimal == 4 * 128 * 8 * 32  # attention alone
    _, qkv = forward_flops_per_token(parse_remat("save_qkv_proj"), *args)
    assert minimal < qkv < full


def test_points_that_cannot_split_the_model_are_invalid() -> None:
    assert invalid_reason(PlanPoint(Layout(1, 4, 2)), SHAPE, 16, 128) is None
    assert "tensor 16" in invalid_reason(PlanPoint(Layout(1, 1, 16)), SHAPE, 16, 128)
    assert "micro-batch 2 (16 / 8)" in invalid_reason(PlanPoint(Layout(1, 8, 1), "full", 8), SHAPE, 16, 128)
    assert "context 3" in invalid_reason(PlanPoint(Layout(1, 1, 1, 3)), SHAPE, 16, 128)
    space = PlanSpace(tensors=(1, 2), contexts=(1, 2), datas=(1, 2), remats=("full", "minimal"), accumulations=(1, 2))
    points = valid_points(space, 8, SHAPE, 16, 128)
    assert len(points) == len(set(points)) == 2 * 2 * 2 * 2 * 2
    assert all(p.layout.devices == 8 for p in points)


def test_the_memory_lower_bound_counts_what_no_compile_can_avoid() -> None:
    params = 10_000_000
    base = memory_lower_bound(PlanPoint(Layout(1, 8, 1)), params, SHAPE, 16, 128)
    assert base.weights_and_moments == 12 * params / 8 and base.accumulated_gradients == 0
    assert base.block_inputs == 4 * (16 / 8 * 128) * 256 * 2
    accumulated = memory_lower_bound(PlanPoint(Layout(1, 8, 1), "full", 2), params, SHAPE, 16, 128)
    assert accumulated.accumulated_gradients == 4 * params / 8 and accumulated.block_inputs == base.block_inputs / 2
    offloaded = memory_lower_bound(
        PlanPoint(Layout(1, 8, 1), "custom:decoder_layer_input=offload"), params, SHAPE, 16, 128
    )
    assert offloaded.block_inputs == 0
    assert memory_lower_bound(PlanPoint(Layout(1, 4, 1, 2)), params, SHAPE, 16, 128).block_inputs == base.block_inputs


# --- the search loop, against a scripted compiler ------------------------------------------


def _search(tmp_path, pool, problem=None, study=None, budget=8, **search_options):
    from tpu_tuner.planner.plans.plan_search import search

    problem = problem or tiny_llama_problem()
    opts = PlanOptions(
        PlanTarget("v5p:2x2x2"),
        search=PlanSearch(budget=budget, space=SEARCH_SPACE, **search_options),
        store=PlanStore(study=study, url=f"sqlite:///{tmp_path / 'plans.db'}"),
    )
    return search(problem, opts, pool, lambda message: None, time.perf_counter())


def test_the_search_compiles_its_budget_and_keeps_every_trial(tmp_path) -> None:
    pool = ShapedPool()
    result = _search(tmp_path, pool, budget=8, sampler="tpe", seed=1)
    compiled_points = {j.point for j in pool.compiled}
    assert len(pool.compiled) == len(compiled_points) == 8  # each point compiled once, the budget exactly
    search = result.search
    assert search["compiled"] == 8 and len(result.plans) == 8
    outcomes = [t["outcome"] for t in search["trials"]]
    assert outcomes.count("compiled") == 8
    assert set(outcomes) <= {"compiled", "invalid", "lower_bound", "repeat", "released"}
    # Nothing whose lower bound exceeds HBM was compiled; every compiled one is at or above its bound.
    for plan in result.plans:
        assert plan.lower_bound_bytes <= plan.compiled.peak_bytes
        assert plan.lower_bound_bytes <= tiny_llama_problem().hbm
    assert result.best is not None and result.best.fits


def test_the_same_plan_run_again_resumes_its_study(tmp_path) -> None:
    first = ShapedPool()
    _search(tmp_path, first, budget=5, sampler="random", seed=3)
    again = ShapedPool()
    result = _search(tmp_path, again, budget=5, sampler="random", seed=3)
    assert again.compiled == []  # the budget is spent: nothing compiles again
    assert result.search["compiled"] == 5
    more = ShapedPool()
    result = _search(tmp_path, more, budget=9, sampler="random", seed=4)
    assert len(more.compiled) == 4 and result.search["compiled"] == 9
    earlier = {j.point for j in first.compiled}
    assert not earlier & {j.point for j in more.compiled}


def test_the_grid_sampler_compiles_every_valid_point_that_may_fit(tmp_path) -> None:
    pool = ShapedPool()
    valid = valid_points(SEARCH_SPACE, 8, tiny_llama_problem().dims.shape, 16, 128)
    bounds = sorted(tiny_llama_problem().lower_bound(p).total for p in valid)
    problem = tiny_llama_problem(hbm_gib=bounds[len(bounds) // 2] / 2**30)  # half the points cannot fit
    result = _search(tmp_path, pool, budget=None, sampler="grid", problem=problem)
    may_fit = [p for p in valid if problem.lower_bound(p).total <= problem.hbm]
    assert result.search["valid_points"] == len(valid)
    assert len(pool.compiled) == len(may_fit) < len(valid)
    assert sum(t["outcome"] == "lower_bound" for t in result.search["trials"]) == len(valid) - len(may_fit)


def test_a_study_that_plans_something_else_is_refused(tmp_path) -> None:
    _search(tmp_path, ShapedPool(), budget=2, sampler="random", study="shared")
    other = replace(tiny_llama_problem(), step=StepSettings(32, 128))
    with pytest.raises(UserInputError, match="study 'shared' plans something else.*global_batch"):
        _search(tmp_path, ShapedPool(), budget=2, sampler="random", study="shared", problem=other)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--remat", "fulll"], "--remat: unknown remat policy 'fulll'"),
        (["--budget", "3", "--remats", "full,custom:mlpwo=disk"], "custom remat takes NAME=ACTION"),
        (["--budget", "0"], "--budget must be at least 1, not 0"),
        (["--layout", "1x4"], "--layout takes DATAxFSDPxTENSOR[xCONTEXT]"),
        (["--remats", "full"], "--remats set(s) the search's space or study: give --budget N"),
        (["--budget", "3", "--layout", "1x4x1"], "--layout names the layouts to compile instead of a search"),
        (["--budget", "3", "--seed", "-1"], "--seed must be 0 or more, not -1"),
    ],
)
def test_bad_plan_options_are_refused_in_one_line(tmp_path, capsys, args, message) -> None:
    from tpu_tuner.cli import main

    status = main(["plan", str(EXAMPLES / "llama.py"), "--topology", "v5e-4", "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow  # ranks or compilers end to end: .ci/run's full pass
def test_two_workers_share_one_plan_study_without_compiling_a_point_twice(tmp_path) -> None:
    """Two processes searching the same study (an SQLite storage; PostgreSQL works the same way)
    compile the budget between them, each point once."""
    import subprocess
    import sys
    import textwrap

    import optuna

    storage = f"sqlite:///{tmp_path / 'plans.db'}"
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from helpers.tiny_planner import SEARCH_SPACE, ShapedPool, tiny_llama_problem
        from tpu_tuner.planner.plans.plan_options import PlanOptions, PlanSearch, PlanStore, PlanTarget
        from tpu_tuner.planner.plans.plan_search import search

        class SlowPool(ShapedPool):
            def compile(self, jobs, done=None):
                time.sleep(0.3)  # long enough for the two workers' trials to overlap
                return super().compile(jobs, done)

        options = PlanOptions(PlanTarget("v5p:2x2x2"),
                              search=PlanSearch(budget=10, space=SEARCH_SPACE, sampler="tpe", seed=int(sys.argv[1])),
                              store=PlanStore(study="shared", url={storage!r}))
        search(tiny_llama_problem(), options, SlowPool(), lambda message: None, time.perf_counter())
    """)
    workers = [
        subprocess.Popen([sys.executable, "-c", code, str(seed)], stderr=subprocess.PIPE, text=True) for seed in (1, 2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-2000:]
    from tpu_tuner.studies.records import attrs

    study = optuna.load_study(study_name="shared", storage=storage)
    compiled = [attrs(t) for t in study.get_trials() if attrs(t).get("outcome") == "compiled"]
    assert len(compiled) == 10, [
        (t.number, t.state.name, attrs(t).get("outcome"), attrs(t).get("point"), attrs(t).get("worker", "")[-6:])
        for t in study.get_trials()
    ]
    assert len({a["point"] for a in compiled}) == 10
    assert len({a["worker"] for a in compiled}) == 2


def test_a_trial_read_while_its_point_is_half_written_has_no_key_and_is_not_written() -> None:
    """Another worker's trial read between its ask and its claim has only some of its axes (they
    are stored one by one): it has no point yet, and the loop waits for it (a KeyError once
    stopped a worker of the shared-study test above)."""
    import optuna
    from optuna.distributions import CategoricalDistribution

    from tpu_tuner.planner.plans.plan_search import PlanTrials
    from tpu_tuner.studies.liveness import Worker

    trials = PlanTrials(
        tiny_llama_problem(), SEARCH_SPACE, ShapedPool(), lambda m: None, 0.0, 8, None, Worker("w", "h", None)
    )  # type: ignore[arg-type]
    half = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING,
        params={"data": 2},
        distributions={"data": CategoricalDistribution([1, 2])},
    )
    assert trials.key_of(half) is None and not trials.setting_written(half)


def test_full_remat_does_not_recompute_a_down_projection_nothing_reads() -> None:
    # Its output only enters the residual sum: the backward pass never reads it (issue 70).
    args = (256, 8, 2, 32, 768, True, 128)
    total, counted = forward_flops_per_token(parse_remat("full"), *args)
    _, plain = forward_flops_per_token(parse_remat("full"), *args, mlp_output_needed=False)
    assert counted == total
    assert plain == total - 2 * 768 * 256
    # A policy that keeps the down-projection recomputes the same either way.
    kept = parse_remat("save_dot_except_mlpwi")
    assert forward_flops_per_token(kept, *args)[1] == forward_flops_per_token(kept, *args, mlp_output_needed=False)[1]


def test_only_a_plain_dense_block_leaves_its_mlp_output_unread() -> None:
    import torch

    from tpu_tuner.model.decoders.decoder import Decoder
    from tpu_tuner.model.decoders.decoder_shape import read_shape
    from tpu_tuner.planner.plans.plan_problem import mlp_output_needed

    base = "decoder:vocab=256,d_model=64,layers=2,heads=4,mlp=128"

    def block(extra: str = "") -> torch.nn.Module:
        with torch.device("meta"):
            return Decoder(read_shape(base + extra)[0]).layers[0]

    assert not mlp_output_needed(block())
    assert mlp_output_needed(block(",post_norms=true"))  # the norm's backward reads it
    assert mlp_output_needed(block(",experts=4,top_k=2"))  # the router's weights' gradient reads it
    assert mlp_output_needed(torch.nn.Linear(4, 4))  # not the generic decoder: as counted before
