"""The `attention_kernel` knob against a stand-in ``torch.tpu.ops.splash_sdpa`` (the default
environment has no torch-tpu): the calls it can serve reach the kernel with the value's block
sizes, every other call runs torch's own SDPA, the replacement holds only inside the step's
context (also while dynamo traces a compiled forward), and it is offered only where the model calls
SDPA."""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.attention_kernel import BLOCK_KEYWORDS, calls_sdpa
from tpu_tuner.knobs.model_traits import of_model
from tpu_tuner.knobs.traits import WorkloadTraits
from tpu_tuner.tuning.search.search_space import SearchSpace

CPU = types.SimpleNamespace(kind="cpu")  # tensors here are CPU tensors: the "device" the kernel serves


def _stand_in(monkeypatch, mark: float) -> list[dict]:
    """Installs a ``torch.tpu.ops.splash_sdpa`` that records each call's keywords and answers with
    torch's own SDPA plus `mark` (so a test can tell its outputs apart); returns the calls."""
    calls: list[dict] = []
    original = F.scaled_dot_product_attention

    def splash_sdpa(q, k, v, **keywords):
        calls.append(keywords)
        gqa = q.shape[1] != k.shape[1]
        return original(q, k, v, is_causal=keywords["is_causal"], scale=keywords["scale"], enable_gqa=gqa) + mark

    monkeypatch.setattr(
        torch, "tpu", types.SimpleNamespace(ops=types.SimpleNamespace(splash_sdpa=splash_sdpa)), raising=False
    )
    return calls


@pytest.fixture
def splash(monkeypatch) -> list[dict]:
    """The stand-in, its outputs marked (+1)."""
    return _stand_in(monkeypatch, 1.0)


@pytest.fixture
def exact_splash(monkeypatch) -> list[dict]:
    """The stand-in answering exactly as torch's SDPA does (a model's loss compares)."""
    return _stand_in(monkeypatch, 0.0)


def _qkv(heads_kv: int = 2, kv_length: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(1, 2, 8, 4), torch.randn(1, heads_kv, kv_length, 4), torch.randn(1, heads_kv, kv_length, 4)


def test_a_servable_call_reaches_splash_with_the_values_block_sizes(splash) -> None:
    knob = knobs.get("attention_kernel")
    q, k, v = _qkv()
    with knob.step("splash:256", CPU):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert knob.observe(nn.Linear(1, 1), nn.Linear(1, 1), CPU) == "splash:256"
    assert splash == [{"scale": None, "is_causal": True, "enable_gqa": False, **dict.fromkeys(BLOCK_KEYWORDS, 256)}]
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v, is_causal=True) + 1)
    with knob.step("splash", CPU):
        F.scaled_dot_product_attention(q, k, v, scale=0.5)
    assert splash[-1] == {"scale": 0.5, "is_causal": False, "enable_gqa": False}  # torch-tpu's own blocks (512)
    assert knob.observe(nn.Linear(1, 1), nn.Linear(1, 1), CPU) == "default"  # torch's own again after the step


@pytest.mark.parametrize(
    "call",
    [
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool)),
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1),
        lambda q, k, v: F.scaled_dot_product_attention(q[0], k[0], v[0]),  # 3-D
    ],
    ids=["mask", "dropout", "3-D"],
)
def test_a_call_splash_cannot_serve_runs_torchs_own(splash, call) -> None:
    q, k, v = _qkv()
    with knobs.get("attention_kernel").step("splash", CPU):
        call(q, k, v)
    assert splash == []


def test_other_lengths_or_devices_run_torchs_own_and_gqa_is_passed_on(splash) -> None:
    knob = knobs.get("attention_kernel")
    with knob.step("splash", CPU):
        F.scaled_dot_product_attention(*_qkv(kv_length=16))  # cross-attention of another length
    with knob.step("splash", types.SimpleNamespace(kind="tpu")):
        F.scaled_dot_product_attention(*_qkv())  # CPU tensors in a TPU step: not the kernel's
    assert splash == []
    with knob.step("splash", CPU):
        F.scaled_dot_product_attention(*_qkv(heads_kv=1), enable_gqa=True)
    assert splash[-1]["enable_gqa"] is True


def test_one_function_per_block_size_so_a_compiled_forward_keeps_its_graph(splash) -> None:
    knob = knobs.get("attention_kernel")
    seen = []
    for _ in range(2):
        with knob.step("splash:1024", CPU):
            seen.append(F.scaled_dot_product_attention)
    assert seen[0] is seen[1]  # dynamo guards on the function: the same one every step


@pytest.mark.slow  # dynamo's first compile in a process: about 3 s
def test_dynamo_traces_the_kernel_into_a_compiled_forward_inside_the_step(splash) -> None:
    knob = knobs.get("attention_kernel")

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    compiled = torch.compile(attend, backend="eager")
    with knob.step("splash:1024", CPU):
        compiled(*_qkv())  # dynamo traces inside the step's context: the kernel is in the graph
    assert splash and splash[-1]["block_q"] == 1024


def test_values_are_checked_and_canonical() -> None:
    knob = knobs.get("attention_kernel")
    assert knob.check("splash:512") == "splash"  # torch-tpu's own block size
    assert knob.check("splash:0256") == "splash:256"
    for bad in ("splash:100", "splash:", "flash", "splash:16384"):
        with pytest.raises(ValueError, match=r"^attention_kernel must be default, splash or splash:N"):
            knob.check(bad)
    assert knob.step_code("splash:256", "tpu") == 'splash_attention(256, "tpu")'
    assert knob.code("splash", "tpu")[0] == "from tpu_tuner.knobs.attention_kernel import splash_attention"
    assert knob.code("splash", "tpu")[-1].startswith("model = leave_causal_mask_to_kernel(model)")
    assert knob.describe("splash:256") == "splash:256 attention"


class Attends(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).unsqueeze(1)
        return self._attend(q)

    def _attend(self, q: torch.Tensor) -> torch.Tensor:  # a helper of the class, as blocks often have
        return F.scaled_dot_product_attention(q, q, q)


def test_offered_only_where_the_model_calls_sdpa() -> None:
    assert calls_sdpa(Attends())
    assert calls_sdpa(nn.Sequential(nn.MultiheadAttention(4, 2)))
    assert not calls_sdpa(nn.Sequential(nn.Linear(4, 4)))
    traits = of_model(Attends(), training=True, batch_size=2)
    assert traits.scaled_dot_product_attention and WorkloadTraits.from_dict(traits.to_dict()) == traits
    space = SearchSpace.load("torchtpu", "tpu")
    without = space.for_workload(of_model(nn.Linear(4, 4), training=True, batch_size=2))
    assert dict((p.name, p.choices) for p in without.params)["attention_kernel"] == ("default",)
    assert any(line.startswith("attention_kernel: the model calls no") for line in without.left_out)
    kept = space.for_workload(traits)
    assert dict((p.name, p.choices) for p in kept.params)["attention_kernel"] == (
        "default",
        "splash",
        "splash:256",
        "splash:1024",
    )


LLAMA = (
    "hf:llama?hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,"
    "num_key_value_heads=2,vocab_size=256"
)


def _compiled_loss(spec: str, switched: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A tiny transformers model's loss, compiled (aot_eager) inside the splash step's context, with
    and without the knob's model hook; and the same model's loss eager with torch's SDPA."""
    pytest.importorskip("transformers")
    from tpu_tuner.model.workloads.loader import load_workload
    from tpu_tuner.model.workloads.workload import call_model

    workload, knob = load_workload(spec), knobs.get("attention_kernel")
    inputs, target = workload.split_batch(workload.batch(2, 16))
    torch.manual_seed(0)
    reference = workload.loss_fn(call_model(workload.build_model(), inputs), target)
    torch.manual_seed(0)
    model = workload.build_model()
    if switched:
        model = knob.model("splash", model, CPU)
    torch._dynamo.reset()
    with knob.step("splash", CPU):
        loss = workload.loss_fn(call_model(torch.compile(model, backend="aot_eager"), inputs), target)
    return loss, reference


def test_a_compiled_transformers_model_reaches_splash_only_with_its_causal_mask_left_to_the_kernel(
    exact_splash,
) -> None:
    """Compiled, transformers hands SDPA a materialised mask, which splash cannot take: no call
    reached it (the chip's "splash" rows on the Llama-class model were torch's SDPA). Switched by
    the knob's model hook, every layer's call reaches it as causal, with the same loss."""
    _compiled_loss(LLAMA, switched=False)
    assert exact_splash == []
    loss, reference = _compiled_loss(LLAMA, switched=True)
    assert len(exact_splash) == 2 and all(call["is_causal"] for call in exact_splash)
    torch.testing.assert_close(loss, reference)


def test_a_sliding_window_shorter_than_the_keys_keeps_its_mask(exact_splash) -> None:
    loss, reference = _compiled_loss(LLAMA.replace("hf:llama", "hf:mistral") + ",sliding_window=8", switched=True)
    assert exact_splash == []  # the window's mask is no causal mask: torch's own SDPA takes it
    torch.testing.assert_close(loss, reference)


def _transposed_layout(t: torch.Tensor) -> torch.Tensor:
    """`t` (batch, heads, length, dim) stored as (batch, length, heads, dim), as a kernel may lay out."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def test_the_kernels_output_and_gradients_reach_the_model_in_a_plain_layout(monkeypatch) -> None:
    """Under `tpu` compile the kernel's traced strides were not the ones it returned, forward and
    backward, so transformers' transpose + reshape, traced as a view, failed on the chip: the knob
    hands on its output and its q, k, v gradients contiguous whatever layout the kernel used."""

    sdpa = F.scaled_dot_product_attention  # torch's own: inside the step the name is the knob's

    class Kernel(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return _transposed_layout(sdpa(q, k, v))

        @staticmethod
        def backward(ctx, grad):
            return tuple(_transposed_layout(torch.ones_like(grad)) for _ in range(3))

    kernel = types.SimpleNamespace(ops=types.SimpleNamespace(splash_sdpa=lambda q, k, v, **_: Kernel.apply(q, k, v)))
    monkeypatch.setattr(torch, "tpu", kernel, raising=False)
    leaves = [t.requires_grad_() for t in _qkv()]
    inputs = [t * 1.0 for t in leaves]  # not leaves: their gradients keep the layout they arrive in
    layouts: list[bool] = []
    for t in inputs:
        t.register_hook(lambda grad: layouts.append(grad.is_contiguous()))
    with knobs.get("attention_kernel").step("splash", CPU):
        out = F.scaled_dot_product_attention(*inputs)
    assert out.is_contiguous()
    out.sum().backward()
    assert layouts == [True, True, True]
