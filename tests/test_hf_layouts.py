"""Sharding layouts of Hugging Face transformers models, from what each model declares: tensor
parallelism by its own ``tp_plan`` (transformers' ``apply_tensor_parallelism``), FSDP2 on its
``_no_split_modules`` blocks. On 2 gloo ranks each matches the single-device fp32 loss and
gradients; a tensor size that would split a head, or a model with no plan, is refused in one line;
the printed apply code works on a model the user built with ``from_config``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from tpu_tuner.runner.launch import run_ranks
from tpu_tuner.runner.sharded_check import check_layout

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent
TOLERANCE = 1e-5  # fp32 on both sides: only the order of reductions differs (test_sharding.py's)
TINY = (
    "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=256,max_position_embeddings=64"
)
LLAMA = f"hf:llama?{TINY}"
QWEN2_TIED = f"hf:qwen2?{TINY},tie_word_embeddings=true"  # attention biases, and a head tied to the embedding
MIXTRAL = f"hf:mixtral?{TINY},num_local_experts=4,num_experts_per_tok=2"  # packed_colwise + moe_tp_experts


def _model(source: str):
    import torch

    from tpu_tuner.model.workloads.loader import load_workload

    torch.manual_seed(0)
    return load_workload(source).build_model()


def _check(source: str, layout: str, nproc: int = 2) -> dict:
    result = check_layout(source, layout, nproc=nproc, timeout_s=240)
    assert result.ok, result.failure
    report = result.reports[0]
    assert report["loss_error"] < TOLERANCE and report["gradient_error"] < TOLERANCE, report
    assert report["gradient_max_abs_diff"] < 1e-5, report
    return report


# One quick case (the tensor plan); the others run in .ci/run's full pass (the default run stays
# within its minutes on 2 cores).
@pytest.mark.parametrize(
    "source, layout",
    [
        (LLAMA, "1x1x2"),
        pytest.param(QWEN2_TIED, "1x1x2", marks=pytest.mark.slow),
        pytest.param(LLAMA, "1x2x1", marks=pytest.mark.slow),
    ],
)
def test_a_layout_from_the_model_s_own_plan_matches_the_single_device_loss_and_gradients(
    source: str, layout: str
) -> None:
    report = _check(source, layout)
    assert report["local_batch"] == (4 if layout == "1x1x2" else 2)  # the tensor ranks share the batch


@pytest.mark.slow  # more families and 4 ranks on a 2-core host: .ci/run's full pass
@pytest.mark.parametrize(
    "source, layout, nproc",
    [
        (MIXTRAL, "1x1x2", 2),
        (MIXTRAL, "1x2x1", 2),
        (QWEN2_TIED, "1x2x1", 2),
        (LLAMA, "2x1x1", 2),
        (LLAMA, "1x2x2", 4),
        (LLAMA, "2x2x1", 4),
    ],
)
def test_more_families_and_two_dimensional_layouts_match_the_single_device_reference(
    source: str, layout: str, nproc: int
) -> None:
    _check(source, layout, nproc)


def test_the_plan_is_expanded_to_the_model_s_names_and_tied_weights_listed_once() -> None:
    from tpu_tuner.parallel import hf

    llama = _model(LLAMA)
    plan = hf.expanded_plan(llama)
    assert plan["model.layers.1.self_attn.k_proj.weight"] == "colwise"
    assert plan["model.layers.0.mlp.down_proj"] == "rowwise"  # the module, hooked; its weight, split
    assert plan["model.embed_tokens.weight"] == "embedding_rowwise"
    assert plan["lm_head"] == "colwise_gather_output"
    assert [type(b).__name__ for b in hf.shard_blocks(llama)] == ["LlamaDecoderLayer"] * 2
    tied = hf.expanded_plan(_model(QWEN2_TIED))
    assert "lm_head.weight" not in tied and "lm_head" in tied  # split once, as the embedding's weight
    assert tied["model.layers.0.self_attn.q_proj.bias"] == "colwise"


def test_a_tensor_size_that_would_split_a_head_or_a_width_is_refused_in_one_line() -> None:
    from tpu_tuner.model.meshes.layouts import Layout
    from tpu_tuner.parallel.apply import why_not

    llama = _model(LLAMA)
    assert why_not(llama, Layout(1, 1, 2), 2, 4) is None
    assert why_not(llama, Layout(1, 1, 4), 4, 4) == "tensor 4 does not divide num_key_value_heads = 2"
    wide = _model(
        "hf:llama?hidden_size=64,intermediate_size=100,num_hidden_layers=2,num_attention_heads=8,"
        "num_key_value_heads=8,vocab_size=256,max_position_embeddings=64"
    )
    assert (
        why_not(wide, Layout(1, 1, 8), 8, 8)
        == "tensor 8 does not divide model.layers.0.mlp.gate_proj.weight (colwise) width = 100"
    )
    gpt2 = _model("hf:gpt2?n_embd=64,n_layer=2,n_head=4,vocab_size=256,n_positions=64")
    assert (
        why_not(gpt2, Layout(1, 1, 2), 2, 4)
        == "GPT2LMHeadModel declares no tensor-parallel plan (tp_plan) in transformers "
        f"{sys.modules['transformers'].__version__}: no tensor layout for it"
    )
    assert why_not(gpt2, Layout(1, 2, 1), 2, 4) is None  # FSDP shards its GPT2Block blocks


def test_apply_layout_refuses_a_head_split_before_anything_is_sharded(monkeypatch) -> None:
    import torch.distributed as dist

    from tpu_tuner.model.meshes.layouts import Layout
    from tpu_tuner.parallel.apply import LayoutError, apply_layout

    mqa = _model(LLAMA.replace("num_key_value_heads=2", "num_key_value_heads=1"))  # one KV head
    monkeypatch.setattr(dist, "get_world_size", lambda *args, **kwargs: 2)  # refused before any collective
    with pytest.raises(LayoutError, match="^layout 1x1x2: tensor 2 does not divide num_key_value_heads = 1$"):
        apply_layout(mqa, Layout(1, 1, 2))


def test_the_search_offers_only_the_tensor_sizes_the_plan_divides() -> None:
    from tpu_tuner.knobs.layout import LayoutKnob
    from tpu_tuner.knobs.model_traits import of_model

    traits = of_model(_model(LLAMA), training=True, batch_size=4)
    assert traits.tensor_divisor == 2  # 4 heads, 2 KV heads, widths 64 / 32 / 128, vocabulary 256
    knob = LayoutKnob()
    assert knob.choice_refusal("1x1x2", traits) is None and knob.choice_refusal("1x2x2", traits) is None
    assert "tensor 4 does not divide" in knob.choice_refusal("1x1x4", traits)


@pytest.mark.parametrize("layout", ["1x1x2", pytest.param("1x2x1", marks=pytest.mark.slow)])
def test_the_printed_apply_code_shards_a_user_s_from_config_model_as_rank_zero_s(monkeypatch, layout: str) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    result = run_ranks(2, "hf_printed_layout_code", [layout], timeout_s=240)
    assert result.ok, result.failure
    reports = result.reports
    assert "apply_layout(model, Layout(" in reports[0]["code"]
    # Each rank built a different model; the layout split rank 0's on both, whole batch each.
    assert abs(reports[0]["own_loss"] - reports[1]["own_loss"]) > 1e-4
    for report in reports.values():
        assert report["observed"] == layout
        assert abs(report["sharded_loss"] - reports[0]["own_loss"]) < 1e-5


@pytest.mark.slow  # two ranks of a from_pretrained model; the printed apply code stays quick
def test_tpu_tuner_apply_shards_a_from_pretrained_model_by_its_plan(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))
    result = run_ranks(2, "hf_printed_layout_code", ["1x1x2", "apply", str(tmp_path)], timeout_s=240)
    assert result.ok, result.failure
    for report in result.reports.values():  # both ranks loaded rank 0's checkpoint
        assert report["observed"] == "1x1x2"
        assert abs(report["sharded_loss"] - result.reports[0]["own_loss"]) < 1e-5


def test_ordinary_models_never_import_transformers() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(FIXTURES)!r})\n"
        "import tiny_llama\n"
        "from tpu_tuner.model.meshes.layouts import Layout\n"
        "from tpu_tuner.parallel.apply import tensor_widths, why_not\n"
        "model = tiny_llama.build_model()\n"
        "assert tensor_widths(model) and why_not(model, Layout(1, 1, 2), 2, 4) is None\n"
        "print('transformers' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
