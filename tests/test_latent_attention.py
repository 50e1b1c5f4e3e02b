"""Multi-head latent attention (tpu_tuner/model/decoders/latent_attention.py): DeepSeek-V2/V3's compressed
query and key/value projections with decoupled rotary keys, its parameters as transformers builds
DeepSeek-V3, its FLOPs by the formula with value heads of their own width, and its compile for a TPU
(values padded to the keys' width for JAX's flash kernel)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import textwrap
from pathlib import Path

import pytest
import torch
from helpers.tiny_planner import run_planner_python

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.metrics.flops import count_step, matmul_parameters, transformer_model_flops
from tpu_tuner.model.decoders.layer_parts import rotate
from tpu_tuner.model.workloads.loader import load_workload

MLA = (
    "decoder:vocab=256,d_model=64,layers=2,heads=4,mlp=96,q_lora_rank=32,kv_lora_rank=16,qk_nope_head_dim=16,"
    "qk_rope_head_dim=8,v_head_dim=12"
)
# DeepSeek-V3 as a shape: the shipped example (MaxText's configs/models/deepseek3-671b.yml and
# transformers' deepseek_v3 defaults; the dense first layers are the shape's dense_layers).
DEEPSEEK_V3 = (Path(__file__).resolve().parent.parent / "examples" / "deepseek_v3.toml").read_text()


def test_latent_attention_computes_deepseeks_attention() -> None:
    """Against attention written out head by head: queries from the normed query latent, keys as
    [the head's part of the expanded KV latent, the one rotary key every head shares], values of
    their own width, causal softmax scaled by the query/key width."""
    torch.manual_seed(0)
    model = load_workload(MLA).build_model()
    attention = model.layers[0].attention
    x = torch.randn(2, 10, 64)
    cos, sin = model.rope_cos[:10], model.rope_sin[:10]
    with torch.no_grad():
        got = attention(x, cos, sin)
        query = attention.wq_b(attention.q_norm(attention.wq_a(x))).view(2, 10, 4, 24)
        latent, key_rope = attention.wkv_a(x).split([16, 8], dim=-1)
        kv = attention.wkv_b(attention.kv_norm(latent)).view(2, 10, 4, 28)
        key_rope = rotate(key_rope, cos, sin)  # [batch, seq, 8]: one per token
        heads = []
        for h in range(4):
            q = torch.cat([query[:, :, h, :16], rotate(query[:, :, h, 16:], cos, sin)], dim=-1)
            k = torch.cat([kv[:, :, h, :16], key_rope], dim=-1)
            scores = q @ k.transpose(1, 2) / math.sqrt(24)
            scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
            heads.append(scores.softmax(-1) @ kv[:, :, h, 16:])
        expected = attention.wo(torch.cat(heads, dim=-1))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    assert attention.wkv_a.out_features == 16 + 8 and attention.wo.in_features == 4 * 12


@pytest.mark.parametrize("q_lora_rank, bias", [(32, False), (None, False), (32, True), (None, True)])
def test_a_deepseek_v3_config_has_the_parameters_of_its_shape(tmp_path, q_lora_rank: int | None, bias: bool) -> None:
    """A tiny transformers DeepSeek-V3 (MLA with and without a query latent, with and without
    attention biases, 4 routed experts top-2, one shared expert, one dense first layer) has exactly
    the parameters of the generic decoder of the shape its config maps to (kv_lora_rank ->
    kv_lora_rank, n_shared_experts -> shared_experts, first_k_dense_replace -> dense_layers, ...;
    the mapping itself is hf_decoder.py's)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.AutoConfig.for_model(
        "deepseek_v3",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        q_lora_rank=q_lora_rank,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        vocab_size=256,
        n_group=1,
        topk_group=1,
        max_position_embeddings=128,
        attention_bias=bias,
    )
    expected = transformers.AutoModelForCausalLM.from_config(config).num_parameters()
    path = tmp_path / "tiny_deepseek_v3.toml"
    path.write_text(
        "[model]\nvocab = 256\nd_model = 64\nlayers = 3\nheads = 4\nmlp = 128\ndense_layers = [0]\n"
        "experts = 4\ntop_k = 2\nexpert_mlp = 32\nshared_experts = 1\nmoe_routing = 'dropless'\n"
        "router = 'sigmoid'\nnorm_topk_prob = true\nrouted_scaling_factor = 2.5\n"
        f"q_lora_rank = {q_lora_rank or 0}\nkv_lora_rank = 16\nqk_nope_head_dim = 16\n"
        f"qk_rope_head_dim = 8\nv_head_dim = 16\nqkv_bias = {str(bias).lower()}\n"
        f"out_bias = {str(bias).lower()}\n"
    )
    model = load_workload(path).build_model()
    assert sum(p.numel() for p in model.parameters()) == expected


def test_deepseek_v3s_shape_is_expressible_with_its_published_size(tmp_path) -> None:
    """DeepSeek-V3 (61 layers, the first 3 dense; MLA; 256 routed experts top-8 and 1 shared) built
    on the meta device has transformers' parameter count for its deepseek_v3 config (whose defaults
    are DeepSeek-V3's), and the FLOPs formula reads its attention as 128 heads of 192 / 128."""
    transformers = pytest.importorskip("transformers")
    path = tmp_path / "deepseek_v3.toml"
    path.write_text(DEEPSEEK_V3)
    workload = load_workload(path)
    with torch.device("meta"):
        model = workload.build_model()
        reference = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("deepseek_v3"))
    assert sum(p.numel() for p in model.parameters()) == reference.num_parameters()
    dims = workload.transformer
    assert (dims.layers, dims.heads, dims.head_dim, dims.value_head_dim) == (61, 128, 192, 128)
    # Active matmul parameters: every weight but the routed experts', which count top_k / experts.
    routed = 58 * 3 * 256 * 7168 * 2048
    assert (
        matmul_parameters(model)
        == sum(p.numel() for p in model.parameters() if p.dim() > 1) - 129280 * 7168 - routed + routed * 8 // 256
    )


@pytest.mark.parametrize(
    "spec", [MLA, MLA.replace("q_lora_rank=32", "q_lora_rank=0")], ids=["query-latent", "no-latent"]
)
def test_counted_flops_equal_the_formula_with_value_heads_of_their_own_width(spec: str) -> None:
    """Scores over the query/key width (nope + rope), weighted values over v_head_dim: the counted
    FLOPs of a training step equal (6N + 6 L H (Qk + Qv) T) x tokens, with and without a query latent."""
    workload = load_workload(spec)
    model = workload.build_model()
    tokens, targets = workload.make_batch(2, 16)
    counted = count_step(lambda: workload.loss_fn(model(tokens), targets).backward())
    formula = transformer_model_flops(matmul_parameters(model), workload.transformer, 2, 16, training=True)
    assert counted.total == formula.per_step
    assert formula.attention_per_step == 12 * 2 * 4 * (24 + 12) / 2 * 16 * 32
    assert "Q=(Qk 24 + Qv 12) / 2" in formula.formula


@pytest.mark.parametrize(
    "extra, words",
    [
        (",qk_rope_head_dim=7", "rotary positions need an even rotated dimension in (0, head_dim], not 7 of 23"),
        (",kv_heads=2", "latent attention has one key/value head per query head"),
        (",positions=learned", "with 'learned' positions"),
        (",v_head_dim=0", "latent attention needs kv_lora_rank, qk_nope_head_dim and v_head_dim of at least 1"),
    ],
)
def test_bad_latent_keys_are_refused_in_one_line(extra: str, words: str) -> None:
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        load_workload(MLA + extra)
    assert len(str(info.value).splitlines()) == 1


def test_latent_keys_without_a_latent_are_refused() -> None:
    with pytest.raises(WorkloadError, match="need latent attention: give kv_lora_rank"):
        load_workload("decoder:vocab=256,d_model=64,layers=2,heads=4,mlp=96,v_head_dim=12")


def test_the_up_projections_split_heads_over_tensor_and_carry_maxtexts_names() -> None:
    """wq_b and wkv_b (latent in, heads out) are column-wise, as MaxText shards them (heads over
    tensor, the latent over fsdp); the block's checkpoint names are MaxText's query_proj / key_proj /
    out_proj, not the MLP's that the widths alone would suggest."""
    from tpu_tuner.model.meshes.layouts import placements
    from tpu_tuner.planner.compiler.remat import block_tensor_roles, mlp_width

    spec = MLA.replace("mlp=96", "mlp=32") + ",experts=4,expert_mlp=16,moe_routing=dropless"
    with torch.device("meta"):
        model = load_workload(spec).build_model()
    placed = placements(model, 64)
    assert placed["layers.0.attention.wq_b.weight"] == placed["layers.0.attention.wkv_b.weight"] == "colwise"
    roles, context = block_tensor_roles(model.layers[0], 64, mlp_width(model.layers[0], 64))
    assert roles == {"attention.wq_b": "query_proj", "attention.wkv_b": "key_proj", "attention.wo": "out_proj"}
    assert context == ("attention.wo",)


PLANNER = importlib.util.find_spec("torchax") is not None and importlib.util.find_spec("libtpu") is not None


@pytest.mark.slow  # three emulated-CPU compiles and one for a TPU topology (~30 s each here)
@pytest.mark.skipif(not PLANNER, reason="the planner extra is not installed: pip install -e '.[plan]'")
def test_the_compiled_step_follows_the_formula_and_compiles_with_the_flash_kernel() -> None:
    """On 4 emulated CPU devices (textbook attention, every matmul counted): widening the value heads
    (32 -> 96) or the keys' part without positions (64 -> 128) adds the compiled FLOPs the formula
    adds; on v5e:2x2 with tensor 2 DeepSeek's head widths (192 / 128) compile with JAX's flash kernel,
    which takes widths up to 128 or multiples of 128: all padded to 256."""
    script = textwrap.dedent("""
        import os, json
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
        import jax, torch
        from tpu_tuner.model.workloads.loader import load_workload
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        from tpu_tuner.planner.compiler.program import compile_step
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        from tpu_tuner.metrics.flops import matmul_parameters, transformer_model_flops
        base = ("decoder:vocab=256,d_model=128,layers=2,heads=4,mlp=256,max_seq_len=512,q_lora_rank=64,"
                "kv_lora_rank=32,qk_rope_head_dim=32")
        out = {}
        for name, extra in (("v32", ",qk_nope_head_dim=64,v_head_dim=32"),
                            ("v96", ",qk_nope_head_dim=64,v_head_dim=96"),
                            ("nope128", ",qk_nope_head_dim=128,v_head_dim=32")):
            w = load_workload(base + extra)
            with torch.device("meta"):
                m = w.build_model()
            job = CompileJob(CompileModel(name, None, 128, 2, scan=True), CompileTarget("cpu"), StepSettings(8, 256),
                             PlanPoint(Layout(1, 4, 1), "none"))
            r = add_loop_iterations(compile_step(job, w.build_model, jax.devices("cpu")), 2)
            formula = transformer_model_flops(matmul_parameters(m), w.transformer, 8, 256, True)
            out[name] = [r.flops * 4, formula.per_step]
        # DeepSeek's head widths: 192-wide queries and keys, 128-wide values (the kernel pads all to 256).
        deepseek_heads = ",qk_nope_head_dim=128,v_head_dim=128"
        w = load_workload(base.replace("qk_rope_head_dim=32", "qk_rope_head_dim=64") + deepseek_heads)
        job = CompileJob(CompileModel("deepseek", None, 128, 2, scan=True), CompileTarget("v5e:2x2"),
                         StepSettings(8, 256), PlanPoint(Layout(1, 2, 2), "full"), fast=True)
        tpu = compile_step(job, w.build_model, topology_devices("v5e:2x2"))
        out["tpu"] = [tpu.error, tpu.flops]
        print(json.dumps(out))
    """)
    data = json.loads(run_planner_python(script))
    (base_compiled, base_formula) = data["v32"]
    for wider in ("v96", "nope128"):  # measured 1.016 and 1.029: elementwise work the formula leaves out
        compiled, formula = data[wider]
        assert compiled - base_compiled == pytest.approx(formula - base_formula, rel=0.05), wider
    assert data["tpu"][0] is None and data["tpu"][1] > 0
