"""gpt-oss's MoE in the generic decoder (model/decoders/experts.py, model/decoders/layer_parts.py): router and expert
biases, the clamped SwiGLU, their gradients through the dropless path's custom ops, the FLOPs
count, the shape keys' refusals, and the whole model against transformers' GptOssForCausalLM."""

from __future__ import annotations

import re

import pytest
import torch
from torch.func import functional_call

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.metrics.flops import count_step, matmul_parameters, transformer_model_flops
from tpu_tuner.model.decoders.decoder import Decoder, decoder_module
from tpu_tuner.model.decoders.decoder_shape import read_shape
from tpu_tuner.model.decoders.layer_parts import clamped_swiglu
from tpu_tuner.model.decoders.transformer_dims import TransformerDims
from tpu_tuner.model.workloads.loader import load_workload

MOE = (
    "decoder:vocab=256,d_model=16,layers=1,heads=2,mlp=12,experts=4,top_k=2,router_bias=true,expert_bias=true,"
    "activation=clamped_swiglu,swiglu_limit=1.5"
)
# A 2-layer gpt-oss in small: window 8 / global, sinks, q/k/v/o biases, dropless biased experts.
GPT_OSS = (
    "decoder:vocab=256,d_model=64,layers=2,heads=4,kv_heads=2,head_dim=16,mlp=32,max_seq_len=64,"
    "sliding_window=8,global_every=2,attention_sinks=true,qkv_bias=true,out_bias=true,experts=4,top_k=2,"
    "moe_routing=dropless,router_bias=true,expert_bias=true,activation=clamped_swiglu"
)


def _moe(extra: str = "", dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    moe = load_workload(MOE + extra).build_model().layers[0].feed_forward.to(dtype)
    with torch.no_grad():  # biases of a size that moves the routing and the clamps
        for name in ("gate_bias", "up_bias", "down_bias"):
            getattr(moe, name).normal_(0, 0.5)
        moe.router.bias.normal_(0, 1.0)
    return moe


def test_the_clamped_swiglu_clips_the_gate_above_and_the_up_projection_both_ways() -> None:
    gate = torch.tensor([-10.0, 0.5, 10.0])
    up = torch.tensor([-10.0, 0.5, 10.0])
    out = clamped_swiglu(gate, up, alpha=1.702, limit=7.0)
    # gate -10 unclipped below; up -10 -> -7; gate 10 -> 7, up 10 -> 7.
    expected = torch.tensor(
        [
            (-7 + 1) * -10 * torch.sigmoid(torch.tensor(-17.02)).item(),
            1.5 * 0.5 * torch.sigmoid(torch.tensor(0.851)).item(),
            8 * 7 * torch.sigmoid(torch.tensor(7 * 1.702)).item(),
        ]
    )
    torch.testing.assert_close(out, expected)


def test_each_token_gets_its_experts_biased_projections_and_the_router_its_bias() -> None:
    """The dropless output equals every token through its chosen experts one at a time: gate and
    up with their expert's biases, the clamped SwiGLU, the down projection and its bias; the
    router's logits carry its bias."""
    moe = _moe(",moe_routing=dropless")
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        weights, chosen = moe.route(x)
        logits = x @ moe.router.weight.T + moe.router.bias
        top, expected_chosen = logits.topk(2, dim=-1)
        assert torch.equal(chosen, expected_chosen)
        torch.testing.assert_close(weights, top.softmax(-1))
        expected = torch.zeros_like(x)
        for b, t, j in ((b, t, j) for b in range(2) for t in range(8) for j in range(2)):
            e = chosen[b, t, j]
            gate, up = x[b, t] @ moe.w_gate[e] + moe.gate_bias[e], x[b, t] @ moe.w_up[e] + moe.up_bias[e]
            hidden = clamped_swiglu(gate, up, 1.702, 1.5)
            expected[b, t] += weights[b, t, j] * (hidden @ moe.w_down[e] + moe.down_bias[e])
        torch.testing.assert_close(moe(x), expected, atol=1e-5, rtol=1e-4)


def test_the_expert_bias_path_has_exact_gradients_through_the_grouped_matmul_ops() -> None:
    """Finite differences (float64) of the dropless MoE's output with respect to the input, every
    expert weight and every bias: the biases' gradients come through the sorted rows' gather,
    the weights' through the grouped-matmul op's own backward, past the clamps."""
    moe = _moe(",moe_routing=dropless", torch.float64)
    names = ["w_gate", "w_up", "w_down", "gate_bias", "up_bias", "down_bias", "router.weight", "router.bias"]
    params = dict(moe.named_parameters())
    x = torch.randn(1, 6, 16, dtype=torch.float64)

    def run(x: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        return functional_call(moe, {**params, **dict(zip(names, values))}, (x,))

    inputs = (x.requires_grad_(), *(params[n].detach().clone().requires_grad_() for n in names))
    # fast_mode: a random projection of the Jacobian, not every column (seconds, not 15 s).
    assert torch.autograd.gradcheck(run, inputs, eps=1e-6, atol=1e-5, fast_mode=True)
    # Some gate and up values sit past the limit: the clamps are exercised (their gradient zero there).
    with torch.no_grad():
        gate = torch.einsum("btd,edw->btew", x, moe.w_gate) + moe.gate_bias
        up = torch.einsum("btd,edw->btew", x, moe.w_up) + moe.up_bias
        assert (gate > 1.5).any() and (up.abs() > 1.5).any()


def test_with_room_for_every_token_the_dropping_router_adds_the_same_biases() -> None:
    """The dropping path (one-hot dispatch) adds each expert's biases to its slots: output and
    bias gradients equal the dropless path's when its capacity holds every token."""
    dropping, dropless = _moe(",capacity_factor=4"), _moe(",moe_routing=dropless")
    dropless.load_state_dict(dropping.state_dict())
    x = torch.randn(2, 8, 16)
    outputs, grads = [], []
    for moe in (dropping, dropless):
        out = moe(x)
        (out**2).sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in (moe.gate_bias, moe.up_bias, moe.down_bias, moe.router.bias)])
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-5, rtol=1e-4)
    for got, expected in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert all(g.abs().sum() > 0 for g in grads[1])


def test_counted_flops_equal_the_formula_and_biases_are_no_matmul_parameters() -> None:
    """A training step of the small gpt-oss counts 6N + 12LHQT exactly (local layers by their
    window): the biases and the clamped SwiGLU are elementwise, the expert biases ([experts,
    width], two-dimensional) are left out of N by their name."""
    shape, _, _ = read_shape(GPT_OSS)
    model, module = Decoder(shape), decoder_module(shape, "gpt-oss", 2, 32)
    tokens = torch.randint(0, 256, (2, 32))
    counted = count_step(lambda: module.loss(model(tokens), tokens).backward())
    formula = transformer_model_flops(matmul_parameters(model), TransformerDims(**module.TRANSFORMER), 2, 32, True)
    assert counted.total == formula.per_step
    attention = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64)  # q, k, v, o weights of both layers
    experts = 2 * (3 * 64 * 32 * 4 * 2 // 4)  # top 2 of 4 experts' gate, up and down
    assert matmul_parameters(model) == attention + experts + 2 * 64 * 4 + 64 * 256  # + routers + head


@pytest.mark.parametrize(
    "extra, words",
    [
        (",experts=0,router_bias=true", "router_bias and expert_bias need routed experts"),
        (",experts=0,expert_bias=true", "router_bias and expert_bias need routed experts"),
        (",activation=clamped_swiglu,gated=false", "activation clamped_swiglu reads a gate and an up projection"),
        (",activation=clamped_swiglu,swiglu_limit=0", "swiglu_alpha and swiglu_limit must be above 0"),
        (",activation=swiglu", "activation must be one of silu, gelu, gelu_tanh, relu, clamped_swiglu"),
    ],
)
def test_bad_gpt_oss_keys_are_refused_in_one_line(extra: str, words: str) -> None:
    spec = "decoder:vocab=64,d_model=16,layers=1,heads=2,mlp=8" + extra
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        read_shape(spec)
    assert len(str(info.value).splitlines()) == 1


def test_the_dense_mlp_takes_the_clamped_swiglu_too() -> None:
    model = load_workload("decoder:vocab=64,d_model=16,layers=1,heads=2,mlp=8,activation=clamped_swiglu").build_model()
    mlp = model.layers[0].feed_forward
    x = torch.randn(3, 16)
    expected = mlp.w_down(clamped_swiglu(mlp.w_gate(x), mlp.w_up(x), 1.702, 7.0))
    torch.testing.assert_close(mlp(x), expected)


def test_the_decoder_computes_what_transformers_gpt_oss_computes() -> None:
    """transformers' GptOssForCausalLM (eager attention, plain rope) with random weights, biases
    and sinks, copied into the mapped decoder (the fused gate_up projection's interleaved columns
    split into gate and up): the same logits, with a clamp limit that bites and a window shorter
    than the sequence."""
    transformers = pytest.importorskip("transformers")
    from tpu_tuner.model.decoders.hf_decoder import decoder_shape

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        "gpt_oss",
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=256,
        max_position_embeddings=128,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        swiglu_limit=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
    )
    config._attn_implementation = "eager"
    theirs = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    ours = Decoder(decoder_shape(config)).eval()
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.normal_(0, 0.3 if "bias" in name or "sinks" in name else 0.1)
        ours.tok_embeddings.weight.copy_(theirs.model.embed_tokens.weight)
        ours.output.weight.copy_(theirs.lm_head.weight)
        ours.norm.weight.copy_(theirs.model.norm.weight)
        for block, layer in zip(ours.blocks(), theirs.model.layers):
            for mine, hf in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj"), ("wo", "o_proj")):
                getattr(block.attention, mine).weight.copy_(getattr(layer.self_attn, hf).weight)
                getattr(block.attention, mine).bias.copy_(getattr(layer.self_attn, hf).bias)
            block.attention.sinks.copy_(layer.self_attn.sinks)
            block.attention_norm.weight.copy_(layer.input_layernorm.weight)
            block.ffn_norm.weight.copy_(layer.post_attention_layernorm.weight)
            moe, experts = block.feed_forward, layer.mlp.experts
            moe.router.weight.copy_(layer.mlp.router.weight)
            moe.router.bias.copy_(layer.mlp.router.bias)
            moe.w_gate.copy_(experts.gate_up_proj[..., ::2])
            moe.w_up.copy_(experts.gate_up_proj[..., 1::2])
            moe.w_down.copy_(experts.down_proj)
            moe.gate_bias.copy_(experts.gate_up_proj_bias[..., ::2])
            moe.up_bias.copy_(experts.gate_up_proj_bias[..., 1::2])
            moe.down_bias.copy_(experts.down_proj_bias)
        tokens = torch.randint(0, 256, (2, 12))
        expected = theirs(tokens).logits
        torch.testing.assert_close(ours(tokens), expected, atol=1e-5, rtol=1e-4)
        assert expected.abs().max() > 0.05


def test_megablox_tiles_a_width_without_a_128_multiple_divisor_irregularly() -> None:
    """gpt-oss's 2880 (no multiple of 128 divides it) takes MaxText's 1024-wide tiles with a partial
    last one, not one 2880-wide block (which overflows the compiler's scoped VMEM); a narrower such
    width stays whole, and divisible widths keep the tiles they had."""
    from tpu_tuner.planner.compiler.grouped_matmul import kernel_tile

    assert kernel_tile(2880, 1024) == 1024 and kernel_tile(2880, 512) == 512
    assert kernel_tile(704, 1024) == 704 and kernel_tile(2816, 1024) == 256 and kernel_tile(4096, 1024) == 1024
