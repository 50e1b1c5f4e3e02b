"""Gemma 3n / Gemma 4's small models in the generic decoder: KV-shared layers, per-layer inputs and
the double-wide MLP (model/decoders/shape_checks.py), against transformers' Gemma 4 text model."""

from __future__ import annotations

import json
import re

import pytest
import torch
from helpers.tiny_planner import run_planner_python

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.metrics.flops import matmul_parameters
from tpu_tuner.model.decoders.decoder import Decoder, LayerGroup, decoder_module
from tpu_tuner.model.decoders.decoder_shape import DecoderShape
from tpu_tuner.model.decoders.shape_checks import kv_donor
from tpu_tuner.model.workloads.structure import read_dims

# A tiny E2B: 4 local : 1 global, wider global heads, the last 4 of 10 layers KV-shared.
TINY = dict(
    vocab=64,
    d_model=32,
    layers=10,
    heads=4,
    kv_heads=1,
    head_dim=8,
    mlp=48,
    activation="gelu_tanh",
    sliding_window=4,
    global_every=5,
    global_head_dim=16,
    qk_norm=True,
    post_norms=True,
    tied_embeddings=True,
    max_seq_len=32,
    norm_eps=1e-6,
    kv_shared_layers=4,
    per_layer_input=8,
    double_wide_mlp=True,
)


def _hf_parameters(shape: DecoderShape) -> int:
    """Parameters of transformers' Gemma4ForCausalLM of `shape`, built on the meta device."""
    config_class = pytest.importorskip("transformers").Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM

    config = config_class(
        vocab_size=shape.vocab,
        hidden_size=shape.d_model,
        intermediate_size=shape.mlp,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        global_head_dim=shape.global_head_dim,
        sliding_window=shape.sliding_window,
        layer_types=["full_attention" if shape.is_global(i) else "sliding_attention" for i in range(shape.layers)],
        hidden_size_per_layer_input=shape.per_layer_input,
        vocab_size_per_layer_input=shape.per_layer_vocab or shape.vocab,
        num_kv_shared_layers=shape.kv_shared_layers,
        use_double_wide_mlp=shape.double_wide_mlp,
    )
    with torch.device("meta"):
        return sum(p.numel() for p in Gemma4ForCausalLM(config).parameters())


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"double_wide_mlp": False},  # E4B
        {"per_layer_input": 0},
        {"kv_shared_layers": 0, "double_wide_mlp": False},
        # Gemma 4 E2B's published shape (MaxText's configs/models/gemma4-e2b.yml, the calibration row)
        dict(vocab=262144, d_model=1536, layers=35, heads=8, kv_heads=1, head_dim=256, mlp=6144, sliding_window=512,
             global_head_dim=512, kv_shared_layers=20, per_layer_input=256, max_seq_len=8192),
    ],
)  # fmt: skip
def test_parameters_are_transformers_gemma4_parameters(extra) -> None:
    shape = DecoderShape(**(TINY | extra))
    shape.check("test")
    with torch.device("meta"):
        model = Decoder(shape)
    assert sum(p.numel() for p in model.parameters()) == _hf_parameters(shape)


def test_shared_layers_are_the_scanned_stack_and_project_no_keys_or_values() -> None:
    shape = DecoderShape(**TINY)
    model = Decoder(shape)
    # Layers 0-5 project their own keys and values (5 local, 4 global: the donors), 6-9 read theirs.
    assert [kv_donor(shape, i) for i in range(10)] == [None] * 6 + [5, 5, 5, 4]
    assert len(model.leading or ()) == 6 and model.trailing is None
    assert len(model.layers) == 1 and isinstance(model.layers[0], LayerGroup)  # 3 local : 1 global, once
    blocks = model.blocks()
    assert [b.kv_shared for b in blocks] == [False] * 6 + [True] * 4
    assert [b.kv_donor for b in blocks] == [False] * 4 + [True] * 2 + [False] * 4
    assert all(b.attention.wk is None and b.attention.wv is None for b in blocks[6:])
    assert [b.feed_forward.w_up.out_features for b in blocks] == [48] * 6 + [96] * 4
    dims = read_dims(model, shape.heads)
    assert (dims.shape.n_layers, dims.scanned, dims.unscanned) == (10, 1, 6)
    assert (dims.shape.d_model, dims.shape.vocab) == (32, 64)  # the token embedding, not the per-layer table


def test_forward_and_backward_run_and_shared_layers_train_their_donors_keys() -> None:
    """The donors' queries and outputs are zeroed, so their own attention adds nothing: their key
    projections still get gradients, through the KV-shared layers that read them."""
    torch.manual_seed(0)
    model = Decoder(DecoderShape(**TINY))
    blocks = model.blocks()
    with torch.no_grad():
        for donor in blocks[4:6]:
            donor.attention.wo.weight.zero_()
    tokens = torch.randint(0, 64, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 64) and torch.isfinite(logits).all()
    logits.float().square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())
    for donor in blocks[4:6]:
        assert donor.attention.wk.weight.grad.abs().sum() > 0
    # Per-layer inputs: every layer's slice of the table gets a gradient.
    table_grad = model.per_layer_embeddings.weight.grad.view(64, 10, 8)
    assert (table_grad.abs().sum(dim=(0, 2)) > 0).all()


def test_no_sharing_builds_the_same_model_as_before() -> None:
    plain = {k: v for k, v in TINY.items() if k not in ("kv_shared_layers", "per_layer_input", "double_wide_mlp")}
    shape = DecoderShape(**plain)
    model = Decoder(shape)
    assert shape.layer_groups() == (0, 5, 2) and len(model.layers) == 2 and model.leading is None
    assert not any(b.kv_shared or b.kv_donor or b.per_layer is not None for b in model.blocks())
    assert not hasattr(model, "per_layer_embeddings")


def test_shared_layers_do_no_key_or_value_projection_flops() -> None:
    shared, plain = DecoderShape(**TINY), DecoderShape(**(TINY | {"double_wide_mlp": False}))
    unshared = DecoderShape(**(TINY | {"kv_shared_layers": 0, "double_wide_mlp": False}))
    models = [Decoder(s) for s in (shared, plain, unshared)]
    kv_weights = 2 * 32 * 8 * 3 + 2 * 32 * 16  # 3 local layers' K and V (8 wide), 1 global's (16 wide)
    assert matmul_parameters(models[2]) - matmul_parameters(models[1]) == kv_weights
    assert matmul_parameters(models[0]) - matmul_parameters(models[1]) == 4 * 3 * 32 * 48  # wider MLPs


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"kv_shared_layers": 6}, "KV-shared layer 4 has no earlier layer of its kind"),
        ({"kv_shared_layers": 10}, "kv_shared_layers must be 0 to layers - 1 (9)"),
        ({"kv_shared_layers": 0}, "double_wide_mlp widens the dense MLP of KV-shared layers"),
        ({"per_layer_input": 0, "per_layer_vocab": 32}, "per_layer_vocab needs the first"),
    ],
)
def test_an_impossible_sharing_is_refused_in_one_line(extra, words) -> None:
    with pytest.raises(WorkloadError, match=re.escape(words)) as info:
        DecoderShape(**(TINY | extra)).check("test")
    assert len(str(info.value).splitlines()) == 1


# Slow (a few minutes on 2 cores): two compiles of the tiny E2B for a TPU topology.
@pytest.mark.slow
def test_the_shared_stack_compiles_scanned_with_the_flops_of_every_layer_unrolled() -> None:
    """The tiny E2B compiled for v5e:2x2: the KV-shared layers scanned (the donors' keys and values
    and the per-layer inputs entering the loop), the plan's one-compile figures (the loop's other
    iterations measured in its HLO) against the same model with every layer unrolled."""

    out = run_planner_python(f"""
        import json
        from tpu_tuner.planner.compiler.compile_request import topology_devices
        from tpu_tuner.model.meshes.layouts import Layout
        from tpu_tuner.model.decoders.decoder import Decoder
        from tpu_tuner.model.decoders.decoder_shape import DecoderShape
        from tpu_tuner.planner.compiler.compiled_step import add_loop_iterations
        import tpu_tuner.planner.compiler.program as program
        from tpu_tuner.planner.compiler.compile_request import CompileJob, CompileModel, CompileTarget, StepSettings
        from tpu_tuner.planner.plans.plan_space import PlanPoint
        shape = DecoderShape(**{TINY | dict(layers=15, kv_shared_layers=10, max_seq_len=512, sliding_window=64)!r})
        devices = topology_devices("v5e:2x2")
        compile = lambda blocks, scan: program.compile_step(CompileJob(
            CompileModel("decoder", None, 32, blocks, scan), CompileTarget("v5e:2x2"), StepSettings(8, 256),
            PlanPoint(Layout(1, 4, 1), "full"), fast=True), lambda: Decoder(shape), devices)
        scanned, unrolled = compile(2, True), compile(2, False)
        whole = add_loop_iterations(scanned, 2)
        print(json.dumps(dict(errors=[scanned.error, unrolled.error], measured=scanned.loop_iteration is not None,
                              flops=[whole.flops, unrolled.flops])))
    """)
    data = json.loads(out)
    assert data["errors"] == [None, None] and data["measured"]
    assert data["flops"][0] == pytest.approx(data["flops"][1], rel=0.01)


def test_the_spans_give_the_hardware_floor_each_layers_projections_and_mlp() -> None:
    spans = decoder_module(DecoderShape(**TINY), "tiny", 1, 16).TRANSFORMER["spans"]
    assert [span.kv_heads for span in spans] == [1] * 6 + [0] * 4
    assert [span.mlp for span in spans] == [48] * 6 + [96] * 4
    assert [span.head_dim for span in spans] == [8, 8, 8, 8, 16, 8, 8, 8, 8, 16]
