"""Planning from a Hugging Face config (model/decoders/hf_decoder.py, planner/plans/hf_plan.py): each mapped family
becomes the generic decoder with exactly the parameters of the transformers model built from the
same config; other decoders are traced through torchax; what neither expresses is refused in one
line. Tiny configs are made in-process (no network)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FIXTURES

transformers = pytest.importorskip("transformers")

from tpu_tuner.core.errors import UserInputError  # noqa: E402
from tpu_tuner.model.decoders import hf_decoder  # noqa: E402
from tpu_tuner.model.decoders.decoder import Decoder  # noqa: E402
from tpu_tuner.model.decoders.hf_decoder import NotExpressible, decoder_shape  # noqa: E402
from tpu_tuner.model.workloads.structure import read_dims  # noqa: E402
from tpu_tuner.planner.plans.hf_plan import planned_workload, source_digest  # noqa: E402

LLAMA_3_2_1B = FIXTURES / "hf" / "llama-3.2-1b"
BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# (model type, config overrides): every family the mapping covers, with the differences that
# change parameters switched on somewhere.
FAMILIES = {
    "llama": ("llama", BASE),
    "llama, tied, biased": ("llama", dict(BASE, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "mistral": ("mistral", dict(BASE, head_dim=32)),
    "qwen2": ("qwen2", BASE),
    "qwen2, tied": ("qwen2", dict(BASE, tie_word_embeddings=True)),
    "qwen3": ("qwen3", dict(BASE, head_dim=32)),
    "gemma": ("gemma", dict(BASE, head_dim=32)),
    "gemma2": ("gemma2", dict(BASE, head_dim=32)),
    "gemma3_text": ("gemma3_text", dict(BASE, head_dim=32)),
    "phi3": ("phi3", dict(BASE, partial_rotary_factor=0.5, pad_token_id=0)),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128)),
    "gpt2, wide MLP": ("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_inner=96, vocab_size=256, n_positions=64)),
    "gpt_neox": ("gpt_neox", dict(BASE, num_key_value_heads=None, intermediate_size=256)),
    "gpt_neox, sequential, no bias, tied": (
        "gpt_neox",
        dict(
            BASE, num_key_value_heads=None, use_parallel_residual=False, attention_bias=False, tie_word_embeddings=True
        ),
    ),
    "mixtral": ("mixtral", dict(BASE, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("qwen2_moe", dict(BASE, **MOE, num_experts=4, shared_expert_intermediate_size=96)),
    "qwen2_moe, dense layers": (
        "qwen2_moe",
        dict(
            BASE,
            **MOE,
            num_experts=4,
            shared_expert_intermediate_size=96,
            num_hidden_layers=4,
            decoder_sparse_step=2,
            mlp_only_layers=[3],
        ),
    ),
    "qwen3_moe": ("qwen3_moe", dict(BASE, **MOE, num_experts=4, head_dim=32)),
    # Today's families (issue 36): local attention in a pattern, dropless experts, latent attention.
    "gemma3_text, 5 local : 1 global": ("gemma3_text", dict(BASE, head_dim=32, num_hidden_layers=7, sliding_window=8)),
    "mistral, sliding window": ("mistral", dict(BASE, sliding_window=8)),
    "llama4_text": (
        "llama4_text",
        dict(
            BASE,
            head_dim=16,
            intermediate_size=32,
            intermediate_size_mlp=96,
            num_hidden_layers=8,
            num_local_experts=4,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            attention_chunk_size=8,
        ),
    ),
    "deepseek_v3": (
        "deepseek_v3",
        dict(
            BASE,
            num_key_value_heads=None,
            num_hidden_layers=4,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            moe_intermediate_size=32,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_group=1,
            topk_group=1,
        ),
    ),
    "gpt_oss": ("gpt_oss", dict(BASE, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8)),
    # Gemma 4 E2B's kind: KV-shared layers, per-layer inputs, a double-wide MLP in the shared layers.
    "gemma4_text": (
        "gemma4_text",
        dict(
            BASE,
            head_dim=16,
            global_head_dim=32,
            num_key_value_heads=1,
            num_hidden_layers=10,
            sliding_window=8,
            layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(10)],
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=256,
            num_kv_shared_layers=4,
            use_double_wide_mlp=True,
        ),
    ),
}


@pytest.mark.parametrize(
    "case, keys",
    [
        ("gemma3_text, 5 local : 1 global", dict(sliding_window=8, global_every=6)),
        ("mistral, sliding window", dict(sliding_window=8, global_every=0)),
        (
            "llama4_text",
            dict(
                attention_chunk=8,
                global_every=4,
                global_rope=False,
                moe_routing="dropless",
                router="topk_sigmoid",
                shared_experts=1,
                dense_layers=(0, 2, 4, 6),
                mlp=96,
                expert_mlp=32,
            ),
        ),
        (
            "deepseek_v3",
            dict(
                kv_lora_rank=16,
                q_lora_rank=32,
                dense_layers=(0,),
                shared_experts=1,
                router="sigmoid",
                moe_routing="dropless",
            ),
        ),
        ("qwen3_moe", dict(moe_routing="dropless", router="softmax_topk")),
        (
            "gemma4_text",
            dict(
                sliding_window=8,
                global_every=5,
                global_head_dim=32,
                kv_shared_layers=4,
                per_layer_input=8,
                per_layer_vocab=256,
                double_wide_mlp=True,
            ),
        ),
        (
            "gpt_oss",
            dict(
                sliding_window=8,
                global_every=2,
                attention_sinks=True,
                qkv_bias=True,
                out_bias=True,
                moe_routing="dropless",
                router="topk_softmax",
                router_bias=True,
                expert_bias=True,
                activation="clamped_swiglu",
                swiglu_alpha=1.702,
                swiglu_limit=7.0,
                experts=4,
                top_k=2,
            ),
        ),
    ],
)
def test_todays_families_map_their_attention_and_experts(case, keys) -> None:
    shape = decoder_shape(_config(*FAMILIES[case]))
    assert {key: getattr(shape, key) for key in keys} == keys


def _config(model_type: str, overrides: dict):
    transformers.logging.set_verbosity_error()
    return transformers.AutoConfig.for_model(model_type, **{k: v for k, v in overrides.items() if v is not None})


@pytest.mark.parametrize("case", list(FAMILIES))
def test_the_planned_decoder_has_the_parameters_of_the_transformers_model(case) -> None:
    config = _config(*FAMILIES[case])
    expected = transformers.AutoModelForCausalLM.from_config(config).num_parameters()
    decoder = Decoder(decoder_shape(config))
    assert sum(p.numel() for p in decoder.parameters()) == expected
    # The decoder with those differences runs forward and backward.
    logits = decoder(torch.randint(0, config.vocab_size, (2, 16)))
    logits.float().mean().backward()
    assert logits.shape == (2, 16, config.vocab_size) and torch.isfinite(logits).all()


def test_the_family_differences_are_where_the_families_put_them() -> None:
    gpt2 = decoder_shape(_config(*FAMILIES["gpt2"]))
    assert (gpt2.positions, gpt2.norm, gpt2.gated, gpt2.activation, gpt2.tied_embeddings) == (
        "learned",
        "layer",
        False,
        "gelu_tanh",
        True,
    )
    neox = decoder_shape(_config(*FAMILIES["gpt_neox"]))
    assert neox.parallel_residual and neox.rotary_fraction == 0.25 and neox.qkv_bias and neox.mlp_bias
    qwen2 = decoder_shape(_config(*FAMILIES["qwen2"]))
    assert qwen2.qkv_bias and not qwen2.out_bias
    assert decoder_shape(_config(*FAMILIES["qwen3"])).qk_norm and decoder_shape(_config(*FAMILIES["gemma2"])).post_norms
    moe = decoder_shape(_config(*FAMILIES["qwen2_moe, dense layers"]))
    assert (moe.experts, moe.expert_mlp, moe.shared_expert_mlp, moe.dense_layers) == (4, 32, 96, (0, 2, 3))


def test_llama_3_2_1b_maps_to_its_published_parameter_count() -> None:
    """The published config (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json,
    in tests/fixtures/hf/llama-3.2-1b/) has 1,235,814,400 parameters with its tied embeddings; the
    mapped decoder and transformers' model, both on the meta device, count that."""
    config = transformers.AutoConfig.from_pretrained(str(LLAMA_3_2_1B), local_files_only=True)
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(config).num_parameters()
        decoder = Decoder(decoder_shape(config))
    assert theirs == sum(p.numel() for p in decoder.parameters()) == 1_235_814_400
    assert decoder.output.weight is decoder.tok_embeddings.weight
    workload = planned_workload(f"hf:{LLAMA_3_2_1B}")
    # Named by its folder; the sequence defaults to the config's positions, at most 8192.
    assert (workload.name, workload.seq_len, workload.batch_size) == ("llama-3.2-1b", 8192, 1)
    assert "as the generic decoder (1,235,814,400 parameters" in workload.notes[0]
    assert (workload.transformer.layers, workload.transformer.heads, workload.transformer.head_dim) == (16, 32, 64)


@pytest.mark.parametrize(
    "source, words",
    [
        (
            "hf:olmoe?num_hidden_layers=2,num_experts=4",
            "routed experts (num_local_experts) in the olmoe config are not expressible",
        ),
        (
            "hf:bert?num_hidden_layers=2",
            "the planner plans causal language models, and this bert config's step is masked-lm",
        ),
        ("hf:llama?num_hidden_layers=2#inference", "the planner plans training steps"),
    ],
)
def test_what_neither_route_can_plan_is_refused_in_one_line(source, words) -> None:
    with pytest.raises(UserInputError, match=re.escape(words)) as info:
        planned_workload(source)
    assert str(info.value).startswith(source) and len(str(info.value).splitlines()) == 1


def test_an_unmapped_decoder_is_traced_through_torchax_with_its_shape_read() -> None:
    source = (
        "hf:olmo2?hidden_size=64,intermediate_size=128,num_hidden_layers=3,num_attention_heads=8,num_key_value_heads=2"
    )
    workload = planned_workload(source)
    assert "traced through torchax (the generic decoder does not map 'olmo2' configs" in workload.notes[0]
    with torch.device("meta"):
        model = workload.build_model()
    # The planner's reading of the traced module: heads from the config, blocks, embedding.
    dims = read_dims(model, workload.transformer.heads)
    assert (dims.shape.n_heads, dims.shape.n_kv_heads, dims.shape.n_layers, dims.shape.d_model) == (8, 2, 3, 64)
    # The attention transformers calls is the planner's (the sharded flash kernel once compiled).
    assert model.model.config._attn_implementation == "tpu_tune_planner"
    assert workload.seq_len == min(workload.hf_config.max_position_embeddings, 8192)


def test_a_mapped_config_whose_count_differs_is_traced_not_planned_wrong(monkeypatch) -> None:
    """The plan-time check is real: a mapping that misses a setting (here attention biases) does
    not plan a decoder with other parameters than the model's."""
    monkeypatch.setitem(
        hf_decoder.FAMILIES, "llama", lambda c: {**hf_decoder._llama_like(c), "qkv_bias": False, "out_bias": False}
    )
    workload = planned_workload(
        "hf:llama?hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,attention_bias=true"
    )
    assert re.search(
        r"traced through torchax \(the generic decoder's reading has [\d,]+ parameters, transformers' "
        r"model [\d,]+",
        workload.notes[0],
    )


def test_the_families_keys_read_from_a_toml_shape_too(tmp_path) -> None:
    """The keys the families add are shape keys like any other: a TOML array of dense layers
    becomes a tuple (the shape stays hashable), and a layer out of range is refused."""
    from tpu_tuner.core.errors import WorkloadError
    from tpu_tuner.model.decoders.decoder_shape import read_shape

    path = tmp_path / "moe.toml"
    path.write_text(
        "[model]\nvocab = 64\nd_model = 32\nlayers = 3\nheads = 4\nmlp = 48\nexperts = 4\n"
        "expert_mlp = 16\nshared_expert_mlp = 24\ndense_layers = [1]\nqk_norm = true\n"
    )
    shape, _, _ = read_shape(path)
    assert shape.dense_layers == (1,) and hash(shape)
    model = Decoder(shape)
    assert [type(b.feed_forward).__name__ for b in model.blocks()] == [
        "MixtureOfExperts",
        "FeedForward",
        "MixtureOfExperts",
    ]
    path.write_text(path.read_text().replace("dense_layers = [1]", "dense_layers = [3]"))
    with pytest.raises(WorkloadError, match=re.escape("dense_layers must name layers 0 to 2, not [3]")):
        read_shape(path)


def test_an_unmapped_family_and_an_unknown_activation_name_what_is_missing() -> None:
    with pytest.raises(NotExpressible, match="does not map 'olmo2' configs"):
        decoder_shape(_config("olmo2", BASE))
    with pytest.raises(NotExpressible, match="the 'quick_gelu' activation is not expressible"):
        decoder_shape(_config("llama", dict(BASE, hidden_act="quick_gelu")))


def test_a_search_names_an_hf_model_by_its_config_not_a_file() -> None:
    plain = source_digest("hf:llama?num_hidden_layers=2")
    assert plain and plain != source_digest("hf:llama?num_hidden_layers=3")
    assert source_digest(str(FIXTURES / "tiny_llama.py")) is None


def test_the_plan_folder_and_the_command_keep_the_config_folder_name(tmp_path) -> None:
    from tpu_tuner.cli.plan import model_source
    from tpu_tuner.outputs.write import plan_run_dir

    assert model_source("hf:./Llama-3.1-70B/") == "hf:./Llama-3.1-70B/"
    assert plan_run_dir(tmp_path, "hf:./Llama-3.1-70B/", "v5p-256").name.startswith("Llama-3.1-70B-plan-v5p-256-")
    assert plan_run_dir(tmp_path, "hf:llama?hidden_size=512", "v5e-16").name.startswith("llama-plan-v5e-16-")


def test_deepseek_v3_and_gpt_oss_plan_as_the_generic_decoder() -> None:
    """DeepSeek-V3 (latent attention, dense leading layers, routed and shared experts) and gpt-oss
    (biased router and experts, clamped SwiGLU, sinks, alternating windows) map onto the generic
    decoder with transformers' parameter count, checked at plan time; the published gpt-oss-120b
    config (the config class's defaults) has its published 116.8B parameters."""
    workload = planned_workload("hf:deepseek_v3?num_hidden_layers=2")
    assert "the deepseek_v3 config as the generic decoder" in workload.notes[0]
    workload = planned_workload("hf:gpt_oss?num_hidden_layers=2")
    assert "the gpt_oss config as the generic decoder" in workload.notes[0]
    config = transformers.AutoConfig.for_model("gpt_oss")  # gpt-oss-120b: 36 layers, 128 experts top 4
    with torch.device("meta"):
        theirs = transformers.AutoModelForCausalLM.from_config(config).num_parameters()
        decoder = Decoder(decoder_shape(config))
    assert sum(p.numel() for p in decoder.parameters()) == theirs == 116_829_156_672


def _plan(args: list[str], out: Path) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "tpu_tuner.cli", "-q", "plan", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"},
    )


_PLANNER = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("torchax") is None
    or __import__("importlib.util").util.find_spec("libtpu") is None,
    reason="the planner extra is not installed: pip install -e '.[plan]'",
)


@_PLANNER
@pytest.mark.slow  # a whole `tpu-tune plan` run: compiles of a 1.2B model for 16 TPU devices
def test_plan_of_the_published_llama_3_2_1b_config_on_v5e_16(tmp_path) -> None:
    result = _plan(
        [f"hf:{LLAMA_3_2_1B}", "--topology", "v5e-16", "--seq", "1024", "--layout", "2x8x1", "--fast"], tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("llama-3.2-1b-plan-v5e-16-")
    import json

    from tpu_tuner.metrics.flops import matmul_parameters

    data = json.loads((run_dir / "plan.json").read_text())
    assert data["topology"]["devices"] == 16 and data["seq_len"] == 1024 and data["global_batch"] == 16
    assert (data["workload"], data["source"]) == ("llama-3.2-1b", f"hf:{LLAMA_3_2_1B}")
    config = transformers.AutoConfig.from_pretrained(str(LLAMA_3_2_1B), local_files_only=True)
    with torch.device("meta"):
        assert data["matmul_parameters"] == matmul_parameters(Decoder(decoder_shape(config)))
    (entry,) = data["plans"]
    assert entry["fits"] and entry["compiled"]["flops"] > 0 and entry["prediction"]["mfu"] > 0
    assert "the llama config as the generic decoder (1,235,814,400 parameters" in result.stdout


@_PLANNER
@pytest.mark.slow  # a whole `tpu-tune plan` run of a traced transformers module
def test_plan_of_an_unmapped_decoder_compiles_the_traced_transformers_module(tmp_path) -> None:
    source = (
        "hf:olmo2?hidden_size=256,intermediate_size=512,num_hidden_layers=2,num_attention_heads=8,"
        "num_key_value_heads=2,vocab_size=1024"
    )
    result = _plan(
        [source, "--topology", "v5e-4", "--global-batch", "8", "--seq", "128", "--layout", "1x2x2", "--fast"], tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "traced through torchax" in result.stdout
    import json

    (run_dir,) = tmp_path.iterdir()
    (entry,) = json.loads((run_dir / "plan.json").read_text())["plans"]
    assert entry["fits"] and entry["compiled"]["flops"] > 0, entry
