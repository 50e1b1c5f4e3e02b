"""Mixtures of experts as run (tpu_tuner/model/decoders/experts.py): dropless routing through grouped matmuls
beside the dropping router, the routers of Mixtral / Qwen / DeepSeek-V3 / Llama 4, ungated shared
experts; the planner compiles the grouped matmuls as megablox kernels (planner/compiler/grouped_matmul.py)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_planner import run_planner_python

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.metrics.flops import count_step, matmul_parameters, transformer_model_flops
from tpu_tuner.model.decoders import experts
from tpu_tuner.model.decoders.experts import grouped_matmul, permute_rows
from tpu_tuner.model.workloads.loader import load_workload

SPEC = "decoder:vocab=256,d_model=32,layers=1,heads=4,mlp=48,experts=4,top_k=2"


def _moe(extra: str = ""):  # type: ignore[no-untyped-def]
    model = load_workload(SPEC + extra).build_model()
    return model, model.layers[0].feed_forward


def _reference(moe, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Every token through its chosen experts, one at a time, weighted."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            for j in range(chosen.shape[-1]):
                e = chosen[b, t, j]
                hidden = F.silu(x[b, t] @ moe.w_gate[e]) * (x[b, t] @ moe.w_up[e])
                out[b, t] += weights[b, t, j] * (hidden @ moe.w_down[e])
    return out


def test_dropless_routing_drops_no_token_and_matches_the_dropping_router_with_room_for_all() -> None:
    """Sorted by expert through grouped matmuls, every (token, choice) reaches its expert: the
    output and every gradient equal the dropping router's when its capacity holds every token;
    at a capacity factor of 0.25 the dropping router loses tokens, the dropless one none."""
    torch.manual_seed(0)
    model, dropping = _moe(",capacity_factor=4")
    dropless_model, dropless = _moe(",moe_routing=dropless")
    dropless_model.load_state_dict(model.state_dict())
    x = torch.randn(2, 16, 32, requires_grad=True)
    outputs, grads = [], []
    for moe in (dropping, dropless):
        moe.zero_grad()
        out = moe(x)
        (out**2).sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in (moe.w_gate, moe.w_up, moe.w_down, moe.router.weight)])
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-4)
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        weights, chosen = dropless.route(x)
        expected = _reference(dropless, x, weights, chosen)
        torch.testing.assert_close(dropless(x), expected, atol=1e-5, rtol=1e-4)
        dropping.capacity_factor = 0.25
        assert (dropping(x).abs().sum(-1) == 0).any() and not torch.allclose(dropping(x), expected, atol=1e-3)


def test_a_sort_group_of_sequences_changes_no_result_and_sorts_their_rows_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner sorts a device's sequences together (sort_group: the sequences it holds, as
    MaxText sorts a device's tokens once): the output and every gradient are the per-sequence
    ones, and the grouped matmuls see two sort groups of 2 x 16 tokens x top_k 2 rows, not four
    of 32, each projection with its checkpoint name."""
    torch.manual_seed(0)
    _, moe = _moe(",moe_routing=dropless")
    x = torch.randn(4, 16, 32, requires_grad=True)
    seen: list[tuple[tuple[int, ...], str]] = []

    def recorded(h: torch.Tensor, w: torch.Tensor, sizes: torch.Tensor, rowwise: bool, role: str = "") -> torch.Tensor:
        if role:  # the forward's projections (the backward's input gradients go through the op unnamed)
            seen.append((tuple(h.shape), role))
        return grouped_matmul(h, w, sizes, rowwise, role)

    monkeypatch.setattr(experts, "grouped_matmul", recorded)
    results = []
    for group in (1, 2):
        moe.sort_group, x.grad = group, None
        moe.zero_grad()
        out = moe(x)
        (out**2).sum().backward()
        results.append([out.detach(), x.grad.clone(), *(p.grad.clone() for p in (moe.w_gate, moe.w_up, moe.w_down))])
    for got, expected in zip(results[1], results[0]):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert [shape for shape, _ in seen] == [
        (4, 32, 32),
        (4, 32, 32),
        (4, 32, 48),
        (2, 64, 32),
        (2, 64, 32),
        (2, 64, 48),
    ]
    assert [role for _, role in seen[3:]] == ["mlpwi_1", "mlpwi_0", "mlpwo"]


def test_the_grouped_matmul_op_passes_torchs_custom_op_checks_and_its_gradient_check() -> None:
    """Its fake (meta) kernel, autograd registration and schema as torch.library.opcheck tests them,
    and finite-difference gradients of x and the weights, with an empty group among the others."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 5, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    sizes = torch.tensor([[2, 0, 4], [3, 3, 0]], dtype=torch.int32)
    torch.library.opcheck(grouped_matmul, (x, weights, sizes, False))
    assert torch.autograd.gradcheck(lambda a, w: grouped_matmul(a, w, sizes, False), (x, weights))
    expected = torch.cat([x[0, :2] @ weights[0], x[0, 2:] @ weights[2]])
    torch.testing.assert_close(grouped_matmul(x, weights, sizes, True)[0], expected)


def test_the_row_permutation_op_passes_the_checks_and_its_gradient_is_the_inverse_permutation() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    index = torch.stack([torch.randperm(5), torch.randperm(5)])
    torch.library.opcheck(permute_rows, (x, index))
    assert torch.autograd.gradcheck(lambda a: permute_rows(a, index), (x,))
    assert torch.equal(permute_rows(x, index)[1], x[1, index[1]])


@pytest.mark.parametrize("router", ["topk_softmax", "softmax_topk", "softmax_topk_norm", "sigmoid", "topk_sigmoid"])
def test_each_router_weighs_the_chosen_experts_as_its_model_does(router: str) -> None:
    """topk_softmax (Mixtral): the top-k logits softmaxed; softmax_topk (Qwen-MoE): softmax over all
    experts, then the top k, renormalised with norm_topk_prob; sigmoid (DeepSeek-V3): sigmoid scores
    pick experts after a selection bias the weights leave out, renormalised, times the routed
    scaling factor; topk_sigmoid (Llama 4): the sigmoid of the top-k logits."""
    name, norm = (router[:-5], True) if router.endswith("_norm") else (router, router == "sigmoid")
    _, moe = _moe(
        f",router={name},norm_topk_prob={str(norm).lower()}"
        + (",routed_scaling_factor=2.5" if name == "sigmoid" else "")
    )
    torch.manual_seed(1)
    x = torch.randn(1, 8, 32)
    logits = moe.router(x)
    if name == "sigmoid":
        moe.score_bias[3] = 10.0  # expert 3 is always chosen, weighed by its unbiased score
    weights, chosen = moe.route(x)
    if name == "topk_softmax":
        top, expected_chosen = logits.topk(2, dim=-1)
        expected = top.softmax(-1)
    elif name == "softmax_topk":
        expected, expected_chosen = logits.softmax(-1).topk(2, dim=-1)
        expected = expected / expected.sum(-1, keepdim=True) if norm else expected
    elif name == "sigmoid":
        scores = torch.sigmoid(logits)
        expected_chosen = (scores + moe.score_bias).topk(2, dim=-1).indices
        picked = scores.gather(-1, expected_chosen)
        expected = 2.5 * picked / picked.sum(-1, keepdim=True)
        assert (chosen == 3).any(-1).all()
    else:
        top, expected_chosen = logits.topk(2, dim=-1)
        expected = torch.sigmoid(top)
    assert torch.equal(chosen, expected_chosen)
    torch.testing.assert_close(weights, expected)
    if norm or name == "topk_softmax":
        torch.testing.assert_close(weights.sum(-1), torch.full((1, 8), 2.5 if name == "sigmoid" else 1.0))


def test_shared_experts_are_always_on_ungated_and_counted_whole() -> None:
    """shared_experts = 2 of width expert_mlp: one MLP twice that wide (DeepSeek's layout), added
    to the routed experts' output without a gate; model FLOPs count it whole and the routed
    experts at top_k / experts."""
    model, moe = _moe(",expert_mlp=16,shared_experts=2,moe_routing=dropless")
    assert moe.shared_experts.w_up.out_features == 32 and moe.shared is None and moe.shared_gate is None
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        routed_only = moe(x) - moe.shared_experts(x)
        moe.w_down.zero_()  # silence the routed experts: what is left is the shared experts' output
        torch.testing.assert_close(moe(x), moe.shared_experts(x))
    assert routed_only.abs().sum() > 0
    attention, router, head = 4 * 32 * 32, 32 * 4, 32 * 256
    assert matmul_parameters(model) == attention + router + head + 3 * 32 * 32 + 3 * 32 * 16 * 4 * 2 // 4


def test_counted_flops_of_a_dropless_moe_equal_the_model_flops_formula() -> None:
    """The grouped matmuls (forward, input and weight gradients) counted as their rows' work: the
    counted FLOPs of a training step equal 6N + 12LHQT with N counting top_k of the experts."""
    workload = load_workload(
        "decoder:vocab=256,d_model=64,layers=2,heads=4,mlp=96,experts=4,top_k=2,expert_mlp=32,"
        "shared_experts=1,moe_routing=dropless,router=sigmoid,norm_topk_prob=true"
    )
    model = workload.build_model()
    tokens, targets = workload.make_batch(2, 16)
    counted = count_step(lambda: workload.loss_fn(model(tokens), targets).backward())
    formula = transformer_model_flops(matmul_parameters(model), workload.transformer, 2, 16, training=True)
    assert counted.total == formula.per_step
    # 2 layers x (3 forward + 3 input-gradient) grouped matmuls, each 2 x rows (batch 2 x seq 16 x top_k 2) x 64 x 32.
    assert counted.by_op["tpu_tune.grouped_matmul"] == 2 * 6 * 2 * (2 * 16 * 2) * 64 * 32


@pytest.mark.parametrize(
    "extra, words",
    [
        (",moe_routing=sparse", "moe_routing must be one of dropping, dropless, not 'sparse'"),
        (",router=softmax", "router must be one of topk_softmax, softmax_topk, sigmoid, topk_sigmoid"),
        (",shared_experts=1,shared_expert_mlp=8", "give shared_experts (ungated"),
        (",shared_experts=-1", "shared_experts must be 0 or more"),
        (",routed_scaling_factor=0", "routed_scaling_factor above 0"),
    ],
)
def test_bad_expert_keys_are_refused_in_one_line(extra: str, words: str) -> None:
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        load_workload(SPEC + extra)
    assert SPEC in str(info.value) and len(str(info.value).splitlines()) == 1


def test_a_bad_expert_key_exits_the_command_with_status_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "profile", SPEC + ",router=softmax"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "router must be one of" in result.stderr


@pytest.mark.slow  # three compiles for a TPU topology (~20-50 s each here)
@pytest.mark.skipif(
    importlib.util.find_spec("torchax") is None or importlib.util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)
def test_the_planner_compiles_dropless_experts_as_grouped_matmuls_of_top_k_work() -> None:
    """On v5e:2x2 (fsdp 4, no remat): the dropless step holds megablox's grouped matmul kernels
    (gmm, and tgmm for the weights' gradient), the dropping one none; one more expert a token
    (top_k 1 -> 2) adds one expert's work, as the model-FLOPs formula says (not every expert's:
    the weights of all 8 are there either way); and the dropping router at capacity factor 1
    computes more than the dropless one, its one-hot dispatch and combine einsums."""
    script = textwrap.dedent("""
        import json, re, torch
        import tpu_tuner.planner.compiler.program as program
        from tpu_tuner.planner.compiler.compile_pool import planned_source, run_job
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
        texts, parse = [], program.parse_collectives
        program.parse_collectives = lambda text: (texts.append(text), parse(text))[1]
        base = "decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256,experts=8,expert_mlp=512,max_seq_len=512"
        out = {}
        for name, extra in (("k1", ",top_k=1,moe_routing=dropless"), ("k2", ",top_k=2,moe_routing=dropless"),
                            ("dropping", ",top_k=2,capacity_factor=1")):
            step = run_job(CompileJob(CompileModel(base + extra, None, 128, 2, scan=True), CompileTarget("v5e:2x2"),
                                      StepSettings(8, 256), PlanPoint(Layout(1, 4, 1), "none"), fast=True))
            assert step.error is None, step.error
            workload = planned_source(base + extra)
            with torch.device("meta"):
                model = workload.build_model()
            formula = transformer_model_flops(matmul_parameters(model), workload.transformer, 8, 256, True).per_step / 4
            out[name] = [add_loop_iterations(step, 2).flops, formula, len(re.findall(r"jit\\(gmm\\)", texts[-1])),
                         len(re.findall(r"jit\\(tgmm\\)", texts[-1]))]
        print(json.dumps(out))
    """)
    data = json.loads(run_planner_python(script))
    (k1, f1, *_), (k2, f2, gmm, tgmm), (dropping, _, dropping_gmm, _) = data["k1"], data["k2"], data["dropping"]
    assert gmm > 0 and tgmm > 0 and dropping_gmm == 0
    # Measured 1.025: the formula leaves out the added choice's activation, gathers and sort.
    assert k2 - k1 == pytest.approx(f2 - f1, rel=0.05)
    assert dropping > 1.1 * k2  # measured 1.21


def test_loop_costs_read_kernel_estimates_spread_over_lines() -> None:
    """megablox's kernels inside called computations print their cost estimate over several lines,
    one starting with "},": the HLO reader keeps such a computation whole (it ends at a line that is
    "}" alone) and reads the estimate's FLOPs, as it reads the compact form of the scan's own kernels
    (seen at Mixtral-8x7B's size on v6e-256; the tiny shapes print every estimate compactly)."""
    from tpu_tuner.planner.compiler import loop_costs

    text = (
        "HloModule m\n"
        "\n"
        "%kernel_call (p: bf16[8]) -> bf16[8] {\n"
        '  %k = bf16[8]{0} custom-call(%p), custom_call_target="tpu_custom_call", '
        'backend_config={"custom_call_config": {"body": "x", "cost_estimate": {\n'
        '"bytes_accessed":10,\n'
        '"flops":123,\n'
        '"transcendentals":0\n'
        '}, "serialization_format": 1}}\n'
        "  ROOT %r = bf16[8]{0} add(%k, %k)\n"
        "}\n"
        "\n"
        "ENTRY %main (q: bf16[8]) -> bf16[8] {\n"
        '  ROOT %c = bf16[8]{0} custom-call(%q), custom_call_target="tpu_custom_call", '
        'backend_config={"cost_estimate":{"flops":"7","bytes_accessed":"2"}}\n'
        "}\n"
    )
    module = loop_costs._Module(text)
    assert list(module.blocks) == ["kernel_call", "main"] and "ROOT %r" in module.blocks["kernel_call"]
    assert sorted(loop_costs._KERNEL_FLOPS.findall(text)) == ["123", "7"]


@pytest.mark.slow  # two emulated-CPU compiles in a process of their own (~20 s here)
@pytest.mark.skipif(
    importlib.util.find_spec("torchax") is None or importlib.util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)
def test_an_expert_axis_splits_a_dropless_moes_rows_as_fsdp_does() -> None:
    """On 4 emulated CPU devices, fsdp 2 x expert 2 computes a dropless step's grouped matmuls on a
    quarter of the rows a device, as fsdp 4 does: the expert axis splits the batch. (Left out of
    the grouped matmuls' batch axes, each row was computed on both devices of the expert axis, twice
    the work: Llama 4 Maverick's expert points compiled at 142-168 GiB against 86 estimated.)"""
    script = textwrap.dedent("""
        import os, json
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax
        from tpu_tuner.model.workloads.loader import load_workload
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        spec = ("decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256,experts=4,top_k=2,expert_mlp=512,"
                "moe_routing=dropless")
        out = {}
        for name, layout in (("fsdp", Layout(1, 4, 1)), ("expert", Layout(1, 2, 1, expert=2))):
            w = load_workload(spec)
            job = CompileJob(CompileModel(spec, None, 128, 2, scan=True), CompileTarget("cpu"), StepSettings(8, 256),
                             PlanPoint(layout, "none"))
            step = compile_step(job, w.build_model, jax.devices("cpu"))
            assert step.error is None, step.error
            out[name] = add_loop_iterations(step, 2).flops
        print(json.dumps(out))
    """)
    flops = json.loads(run_planner_python(script))
    assert flops["expert"] == pytest.approx(flops["fsdp"], rel=0.05), flops
