"""Hugging Face models as workloads (`hf:` sources): loading, the model's own step, declared FLOPs,
the knobs the model declares, and the one-line refusals. Offline: tiny configs built in-process
and a config folder in tests/fixtures/hf."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from tpu_tuner.cli import main
from tpu_tuner.core.errors import UserInputError
from tpu_tuner.knobs import activation_checkpointing
from tpu_tuner.knobs.activation_checkpointing import ActivationCheckpointingKnob, checkpoint_blocks
from tpu_tuner.knobs.attn_implementation import AttnImplementationKnob
from tpu_tuner.knobs.model_traits import of_model
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.metrics.flops import count_step, matmul_parameters, transformer_model_flops
from tpu_tuner.model.workloads.loader import load_workload
from tpu_tuner.model.workloads.workload import call_model
from tpu_tuner.studies.fingerprint import file_sha256

FOLDER = Path(__file__).parent / "fixtures" / "hf" / "tiny-qwen2"
SMALL = (
    "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,num_key_value_heads=2,"
    "vocab_size=256"
)
FAMILIES = {
    "llama": f"hf:llama?{SMALL}",
    "qwen2": f"hf:qwen2?{SMALL}",
    "mistral": f"hf:mistral?{SMALL}",
    "gemma2": f"hf:gemma2?{SMALL},head_dim=16",
    "phi3": f"hf:phi3?{SMALL}",
    "mixtral": f"hf:mixtral?{SMALL},num_local_experts=4,num_experts_per_tok=2",
    "gpt2": "hf:gpt2?n_embd=64,n_layer=2,n_head=4,vocab_size=256",
}


def _step(workload, model, batch_size=2, seq_len=16):
    inputs, target = workload.split_batch(workload.batch(batch_size, seq_len))
    output = call_model(model, inputs)
    loss = workload.loss_fn(output, target)
    loss.backward()
    return loss


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_trains_with_its_own_loss_and_the_declared_formula_matches_the_counter(family: str) -> None:
    workload = load_workload(FAMILIES[family])
    assert workload.hf_task == "causal-lm" and workload.is_training
    torch.manual_seed(0)
    model = workload.build_model()
    batch_size, seq_len = 2, 16
    counted = count_step(lambda: _step(workload, model, batch_size, seq_len))
    loss = _step(workload, model, batch_size, seq_len)
    # The model's own cross-entropy over a 256-token vocabulary starts near ln(256) = 5.55.
    assert 4.5 < float(loss.detach()) < 6.5
    dims = workload.transformer
    assert dims is not None and dims.layers == 2 and dims.heads == 4 and dims.head_dim == 16
    formula = transformer_model_flops(matmul_parameters(model), dims, batch_size, seq_len, training=True)
    assert formula.per_step == pytest.approx(counted.total, rel=0.01), (family, formula.formula)


def test_a_mixture_of_experts_counts_the_experts_a_token_uses() -> None:
    workload = load_workload(FAMILIES["mixtral"])
    model = workload.build_model()
    experts = [m for m in model.modules() if getattr(m, "n_experts", None) == 4]
    assert experts and all(m.top_k == 2 for m in experts)
    # Half of the stacked expert weights (2 of 4 experts a token) are in N; the embedding lookup is not.
    expected = sum(
        p.numel() // (2 if p.dim() == 3 else 1)
        for name, p in model.named_parameters()
        if p.dim() >= 2 and not name.endswith("embed_tokens.weight")
    )
    assert matmul_parameters(model) == expected


def test_a_config_folder_loads_and_names_the_run_and_its_digest_follows_the_config(tmp_path: Path) -> None:
    workload = load_workload(f"hf:{FOLDER}")
    assert workload.name == "tiny-qwen2" and workload.hf_task == "causal-lm"
    assert workload.hf_config.vocab_size == 512
    copy = tmp_path / "tiny-qwen2"
    copy.mkdir()
    text = (FOLDER / "config.json").read_text()
    (copy / "config.json").write_text(text)
    before = file_sha256(f"hf:{copy}")
    (copy / "config.json").write_text(text.replace('"vocab_size": 512', '"vocab_size": 1024'))
    assert file_sha256(f"hf:{copy}") != before
    # A shallower copy of a published config: its per-layer pattern follows the new depth.
    shallow = load_workload(f"hf:{copy}?num_hidden_layers=3").hf_config
    assert shallow.num_hidden_layers == 3 and shallow.layer_types == ["full_attention"] * 3


def test_the_other_heads_the_config_declares() -> None:
    bert = load_workload(
        "hf:bert?hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,vocab_size=256"
    )
    assert bert.hf_task == "masked-lm" and bert.transformer is not None and not bert.transformer.causal
    assert any("dropout off" in note for note in bert.notes)
    inputs, _ = bert.split_batch(bert.batch(2, 16))
    assert ((inputs["labels"] == -100).float().mean() > 0.5) and (inputs["labels"] != -100).any()
    t5 = load_workload("hf:t5?d_model=64,d_ff=128,num_layers=2,num_heads=4,d_kv=16,vocab_size=256")
    assert t5.hf_task == "seq2seq" and t5.transformer is None  # counted FLOPs: two stacks, cross-attention
    classifier = load_workload(f"hf:llama?{SMALL}#task=classification")
    for workload in (bert, t5, classifier):
        torch.manual_seed(0)
        assert torch.isfinite(_step(workload, workload.build_model()))


def test_inference_is_the_forward_pass_without_labels() -> None:
    workload = load_workload(f"hf:llama?{SMALL}#inference")
    assert not workload.is_training
    inputs = workload.batch(2, 8)
    assert set(inputs) == {"input_ids"}
    with torch.no_grad():
        output = call_model(workload.build_model(), inputs)
    assert output.logits.shape == (2, 8, 256)


def test_the_attention_knob_switches_the_model_and_its_code_line_runs_on_a_fresh_model() -> None:
    workload = load_workload(f"hf:llama?{SMALL}")
    knob = AttnImplementationKnob()
    torch.manual_seed(0)
    model = workload.build_model()
    traits = of_model(model, training=True, batch_size=2)
    assert "eager" in traits.attention_implementations and "sdpa" not in traits.attention_implementations
    assert knob.applies_to_workload(traits) and knob.choice_refusal("eager", traits) is None
    assert knob.choice_refusal("sdpa", traits) is not None  # what the model already runs: the default
    assert not knob.applies_to_workload(WorkloadTraits(True, 0, 2, 2))  # no switch: not searched
    assert knob.observe(model, model, None) == "default"
    reference = _step(workload, model)
    torch.manual_seed(0)
    switched = knob.model("eager", workload.build_model(), None)
    assert knob.observe(switched, switched, None) == "eager"
    assert float(_step(workload, switched)) == pytest.approx(float(reference), rel=1e-5)
    torch.manual_seed(0)
    fresh = workload.build_model()
    assert fresh.config._attn_implementation == "sdpa"  # a build's config is its own
    exec("\n".join(knob.code("eager", "cpu")), {"model": fresh, "torch": torch})
    assert fresh.config._attn_implementation == "eager"


def test_the_attention_knob_on_the_trial_path_and_the_apply_path(tmp_path: Path) -> None:
    """The knob contract (tests/test_knobs.py) on a transformers model: the trial's candidate and
    `apply` of its tuned config leave the same implementation in force."""
    from tpu_tuner.devices.cpu import CpuBackend
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.knobs.tuned_config import TunedConfig, apply

    workload, knob, backend = load_workload(f"hf:llama?{SMALL}"), AttnImplementationKnob(), CpuBackend()
    candidate = Candidate({"attn_implementation": "eager"})
    trial = candidate.prepare_model(workload.build_model(), backend)
    assert knob.observe(trial, trial, backend) == "eager" and "eager attention" in candidate.describe()
    loaded = TunedConfig.load(TunedConfig(candidate, "cpu").save(tmp_path / "tuned_config.toml"))
    applied = apply(workload.build_model(), loaded)
    try:
        assert knob.observe(applied.model, applied.model, backend) == "eager"
    finally:
        applied.restore()


@pytest.mark.parametrize("before_every_n_layers", [False, True])
@pytest.mark.parametrize(("value", "every"), [("blocks", 1), ("every_2nd", 2)])
def test_activation_checkpointing_goes_through_the_models_own_switch(
    value: str, every: int, before_every_n_layers: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `activation_checkpointing_enable`, or the layers' own flags in a transformers
    without it (5.17, on the chip: this module's wrapper failed there under `tpu` compile)."""
    if before_every_n_layers:
        monkeypatch.setattr(activation_checkpointing, "takes_every_n_layers", lambda model: False)
    workload = load_workload(f"hf:llama?{SMALL.replace('num_hidden_layers=2', 'num_hidden_layers=4')}")
    torch.manual_seed(0)
    plain = workload.build_model()
    _step(workload, plain)
    torch.manual_seed(0)
    model = checkpoint_blocks(workload.build_model(), every=every)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [i % every == 0 for i in range(4)]
    assert ActivationCheckpointingKnob().observe(model, model, None) == value
    _step(workload, model)
    for p, q in zip(plain.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["hf:lama"], "unknown transformers model type 'lama'; did you mean llama"),
        (["hf:llama?hiden_size=64"], "LlamaConfig has no setting 'hiden_size'"),
        (["hf:vit"], "declares no head tpu-tune can run"),
        (["hf:llama", "--weights"], "--weights needs a folder or a hub id"),
        (["hf:./no-such-folder/"], "no such folder"),
    ],
)
def test_bad_sources_are_one_line_with_status_2_and_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    out = tmp_path / "results"
    assert main(["profile", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("tpu-tune: error: hf:")
    assert not out.exists()


def test_a_folder_without_config_and_the_flags_on_a_plain_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["profile", f"hf:{tmp_path / 'empty'}", "--out", str(tmp_path / "r")]) == 2
    assert "no config.json in" in capsys.readouterr().err
    model = Path(__file__).parent / "fixtures" / "tiny_gpt.py"
    assert main(["profile", str(model), "--inference", "--out", str(tmp_path / "r")]) == 2
    assert "--inference is for Hugging Face models" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_an_uncached_hub_id_offline_is_refused_in_one_line(tmp_path: Path) -> None:
    """(How long it takes is benchmarks/models/hf_models.py's `refusals` part: timing is not a unit test.)"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpu_tuner.cli",
            "tune",
            "hf:Qwen/Qwen2.5-0.5B",
            "--inference",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "Qwen/Qwen2.5-0.5B is not in the local Hugging Face cache" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_without_transformers_one_line_says_which_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails
    assert main(["profile", f"hf:llama?{SMALL}", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("pip install 'tpu-tune[hf]'") and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_weights_load_the_checkpoint_the_folder_holds(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", **{k: int(v) for k, v in (item.split("=") for item in SMALL.split(","))})
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(1)
    saved = AutoModelForCausalLM.from_config(config)
    saved.save_pretrained(tmp_path / "tiny-llama")
    loaded = load_workload(f"hf:{tmp_path / 'tiny-llama'}#weights").build_model()
    random = load_workload(f"hf:{tmp_path / 'tiny-llama'}").build_model()
    weight = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(dict(loaded.named_parameters())[weight], dict(saved.named_parameters())[weight])
    assert not torch.equal(dict(random.named_parameters())[weight], dict(saved.named_parameters())[weight])
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text((tmp_path / "tiny-llama" / "config.json").read_text())
    with pytest.raises(UserInputError, match="cannot load the weights of"):
        load_workload(f"hf:{tmp_path / 'config-only'}#weights").build_model()
