"""Issue 55, item 6: the report's header states batch and sequence from what the workload itself
declares, with which input dimension each is and how that was decided; where nothing decides, the
first input's dims, and no batch claimed (a GRU's report had said "batch 512" for its sequence)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
from conftest import FIXTURES

from tpu_tuner.model.workloads.input_dims import InputDims, SizeOf, recorded_dims
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.profiled import ProfiledWorkload
from tpu_tuner.model.workloads.summary import summarize

CPU = SimpleNamespace(kind="cpu", device_name=lambda: "host cpu")


def _dims(path, batch_size=None, seq_len=None) -> InputDims:
    dims = summarize(load_workload(path), CPU, batch_size, seq_len).dims
    assert dims is not None
    return dims


def test_the_lstm_fixture_says_its_declared_batch_and_sequence() -> None:
    # tests/fixtures/kernelbench_lstm.py: batch_size = 2, sequence_length = 16, input (2, 16, 8), batch_first.
    dims = _dims(FIXTURES / "kernelbench_lstm.py")
    assert dims.batch == SizeOf(2, 0, "the file's batch_size") and dims.seq == SizeOf(
        16, 1, "the file's sequence_length"
    )
    assert dims.describe() == (
        "first input (2, 16, 8): batch 2 at dim 0 (the file's batch_size), seq 16 at dim 1 (the file's sequence_length)"
    )


def test_a_sequence_first_gru_is_not_called_batch_512() -> None:
    dims = _dims(FIXTURES / "kernelbench_gru_seq_first.py")
    assert dims.describe() == (
        "first input (512, 10, 64): batch 10 at dim 1 (the file's batch_size), seq 512 at dim 0 (the file's seq_len)"
    )


def test_without_declared_sizes_the_recurrent_layer_decides_else_nothing_is_claimed(tmp_path) -> None:
    source = (FIXTURES / "kernelbench_gru_seq_first.py").read_text()
    bare = tmp_path / "gru_bare.py"
    # The same GRU, its sizes written into get_inputs() instead of declared.
    bare.write_text(
        source.replace("batch_size = 10\nseq_len = 512\n", "").replace(
            "torch.randn(seq_len, batch_size, input_size)", "torch.randn(512, 10, input_size)"
        )
    )
    assert _dims(bare).describe() == (
        "first input (512, 10, 64): batch 10 at dim 1 (nn.GRU without batch_first takes (seq, batch, features)), "
        "seq 512 at dim 0 (nn.GRU without batch_first takes (seq, batch, features))"
    )
    # An MLP declaring nothing: its dims, no batch claimed.
    assert _dims(FIXTURES / "tiny_mlp_benchmark.py").describe() == "first input dims (4, 16)"


def test_a_native_file_says_its_declarations_or_the_flags_that_replaced_them() -> None:
    assert _dims(FIXTURES / "tiny_gpt.py").describe() == "batch 2 (BATCH_SIZE), seq 32 (SEQ_LEN)"
    assert _dims(FIXTURES / "tiny_gpt.py", batch_size=4).describe() == "batch 4 (--batch-size), seq 32 (SEQ_LEN)"


def test_the_report_header_says_dims_not_a_guessed_batch(tmp_path) -> None:
    from helpers.common import window_result

    from tpu_tuner.outputs.tuning_report import render_report
    from tpu_tuner.tuning.run.shared_study import RECORD_ATTR

    result = window_result(tmp_path)
    # As the profile records a benchmark file's batch: dim 0 of its first input, here the sequence.
    gru = ProfiledWorkload("gru", "gru.py", "benchmark", training=False, batch_size=512)
    result.profile.workload = gru  # type: ignore[misc]
    result.study.set_user_attr(RECORD_ATTR, {"fingerprint": {"inputs": [[[512, 10, 64], "float32"]]}})
    header = render_report(result, {}).splitlines()[2]
    assert header.startswith("inference (forward), first input dims (512, 10, 64). Objective:"), header
    assert "batch 512" not in header
    # Where the file's declarations were read (the worker that imported it), they are said.
    declared = InputDims((512, 10, 64), SizeOf(10, 1, "the file's batch_size"), SizeOf(512, 0, "the file's seq_len"))
    result.profile.workload = dataclasses.replace(gru, dims=declared)  # type: ignore[misc]
    said = render_report(result, {}).splitlines()[2]
    assert said.startswith(
        "inference (forward), first input (512, 10, 64): batch 10 at dim 1 (the file's batch_size), "
        "seq 512 at dim 0 (the file's seq_len). Objective:"
    )
    # A native file's header names its declarations (the fixture run's BATCH_SIZE is 32).
    assert (
        render_report(window_result(tmp_path), {}).splitlines()[2].startswith("training step, batch 32 (BATCH_SIZE).")
    )


def test_profile_json_keeps_the_dims_and_older_profiles_read_back_without() -> None:
    dims = InputDims((512, 10, 64), SizeOf(10, 1, "the file's batch_size"), None)
    workload = ProfiledWorkload("gru", "gru.py", "benchmark", training=False, batch_size=512, dims=dims)
    again = ProfiledWorkload.from_dict(json.loads(json.dumps(workload.to_dict())))
    assert again == workload and again.sizes() == "first input (512, 10, 64): batch 10 at dim 1 (the file's batch_size)"
    older = {k: v for k, v in workload.to_dict().items() if k != "dims"}
    assert "dims" not in ProfiledWorkload.from_dict(older).to_dict()
    assert recorded_dims("benchmark", 512, None).describe() == ""  # nothing recorded: nothing claimed


@pytest.mark.slow  # a 512-step GRU profiled: about 50 s on 2 loaded cores
def test_tpu_tune_profile_says_the_declared_batch_too(fast_settings) -> None:
    """`tpu-tune profile`'s report read its header from dim 0 as well ("batch 512")."""
    import tpu_tuner
    from tpu_tuner.outputs.profile_report import render_markdown

    profile = tpu_tuner.profile(FIXTURES / "kernelbench_gru_seq_first.py", device="cpu", settings=fast_settings)
    header = next(line for line in render_markdown(profile).splitlines() if "kernelbench_gru_seq_first (" in line)
    assert "batch 10 at dim 1" in header and "batch 512" not in header


def test_a_profile_says_the_files_own_sizes_as_the_files() -> None:
    """A run with no flags read "batch 8 (--batch-size), seq 256 (--seq-len)" for examples/gpt.py's
    own BATCH_SIZE and SEQ_LEN (the profile passed the sizes it had resolved as the flags)."""
    import tpu_tuner
    from tpu_tuner.profiling import ProfilerSettings

    fast = ProfilerSettings(timing_min_steps=2, timing_min_seconds=0.0, warmup_min_steps=1, warmup_max_steps=2)
    profile = tpu_tuner.profile(FIXTURES / "tiny_gpt.py", device="cpu", settings=fast)
    assert profile.workload.sizes() == "batch 2 (BATCH_SIZE), seq 32 (SEQ_LEN)"
