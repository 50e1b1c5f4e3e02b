"""`tpu-tune plan`'s step section (`PlanStep`: the training step planned), apart from options.py
so that each stays a module one can read whole; options.py re-exports it."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.core.flags import ATTENTION, SEQ_LEN, DefaultWords, at_least, option, uses
from tpu_tuner.metrics.flops import AttentionConvention
from tpu_tuner.planner.compiler.optimizer import check_optimizer
from tpu_tuner.planner.compiler.quantized_matmul import QUANTIZATIONS
from tpu_tuner.planner.compiler.remat import parse_remat
from tpu_tuner.planner.plans.plan_space import flash_block_refusal

DTYPES = ("float32", "bfloat16")


class DefaultRemat(str):
    """The plan's remat policy when none was chosen (full), marked as the default: with nothing
    estimated to fit, the enumeration may plan other policies (fits_first.widened); a policy the
    user gave, `--remat full` included, is a plain str and is held to."""


class DefaultAccumulation(int):
    """One micro-batch when none was chosen, marked as the default as `DefaultRemat` is (on the
    command line `--accumulation 1` reads as not given: argparse's int hands back a plain 1)."""


@dataclass(frozen=True)
class PlanStep:
    """The training step planned: its sizes, rematerialisation, micro-batches and precision
    (docs/planner.md, "Precision of the step"), by MaxText's names."""

    global_batch: int | None = option(
        None,
        "--global-batch",
        type=int,
        help="sequences per step (default: BATCH_SIZE per device; an hf: config: one per device)",
    )
    seq_len: int | None = uses(
        None,
        SEQ_LEN,
        help="sequence length (default: the file's SEQ_LEN; an hf: config's max_position_embeddings, at most 8192)",
    )
    preset: str | None = option(None, "--preset", help="a named model size from the file's PRESETS, e.g. 70b")
    remat: str = option(
        DefaultRemat("full"),
        "--remat",
        metavar="POLICY",
        typed=DefaultWords("full"),
        help="per-block rematerialisation, by MaxText's names: full, minimal, save_dot_except_mlpwi, "
        "save_qkv_proj, qkv_proj_offloaded, minimal_offloaded, ..., none, or "
        "custom:decoder_layer_input=offload,query_proj=device,... (default %(default)s; docs/planner.md)",
    )
    accumulation: int = option(
        DefaultAccumulation(1),
        "--accumulation",
        type=int,
        metavar="N",
        help="micro-batches a step (gradient accumulation; default %(default)s)",
    )
    optimizer: str = option(
        "adamw",
        "--optimizer",
        metavar="adamw|sgd",
        help="the step's optimizer, as MaxText's opt_type: adamw (two moments a parameter) or sgd "
        "(optax.sgd without momentum: no state); default %(default)s",
    )
    first_moment_dtype: str | None = option(
        None,
        "--mu-dtype",
        choices=DTYPES,
        help="AdamW's first moment's storage (MaxText's mu_dtype; default: the weights' dtype, as "
        "MaxText's mu_dtype follows weight_dtype when unset)",
    )
    weight_dtype: str = option(
        "float32",
        "--weight-dtype",
        metavar="float32|bfloat16",
        help="the master weights' storage, and so the gradients' and AdamW's second moment's "
        "(MaxText's weight_dtype; default %(default)s)",
    )
    quantization: str | None = option(
        None,
        "--quantization",
        metavar="int8|fp8",
        help="run the decoder blocks' matmuls, forward and backward, in 8 bits: int8 (MaxText's "
        "AQT int8; v5e, v6e) or fp8 (MaxText's fp8_full; TPU7x); default: bf16. MFU stays "
        'against the bf16 peak (docs/planner.md, "Precision of the step")',
    )
    vocab_tiling: int = option(
        1,
        "--vocab-tiling",
        type=int,
        metavar="N",
        help="compute the loss's logits N slices of the sequence at a time (MaxText's num_vocab_tiling; "
        "the generic decoder's shapes; default %(default)s)",
    )
    attention: AttentionConvention = uses("full", ATTENTION)  # MFU convention
    # StepSettings.flash_block (docs/planner.md, "On a real chip").
    flash_block: int | None = option(
        None,
        "--flash-block",
        type=int,
        metavar="N",
        help="compile the attention's Pallas flash kernel in N x N blocks (MaxText's sa_block_q, sa_block_kv, ...; "
        "on a v5e chip 512 ran attention 5x faster than the default 128); must divide the sequence "
        "(default: the kernel's own, as the calibration rows were compiled)",
    )

    def __post_init__(self) -> None:
        check_field_types(self)  # the Python API may pass any value
        at_least(1, ("--global-batch", self.global_batch), ("--seq-len", self.seq_len))
        at_least(1, ("--accumulation", self.accumulation), ("--vocab-tiling", self.vocab_tiling))
        at_least(1, ("--flash-block", self.flash_block))
        # A sequence given here is checked at once; one the model file gives, when it is read (problem.py).
        refusal = flash_block_refusal(self.flash_block, self.seq_len) if self.seq_len else None
        if refusal:
            raise UserInputError(f"--flash-block: {refusal}")
        parse_remat(self.remat, "--remat")
        check_optimizer(self.optimizer)
        if self.optimizer == "sgd" and self.first_moment_dtype is not None:
            raise UserInputError("--mu-dtype is AdamW's first moment's storage: --optimizer sgd keeps no moments")
        for name, dtype in (("--weight-dtype", self.weight_dtype), ("--mu-dtype", self.first_moment_dtype)):
            if dtype is not None and dtype not in DTYPES:
                raise UserInputError(f"{name} takes float32 or bfloat16, not {dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise UserInputError(f"--quantization takes {' or '.join(QUANTIZATIONS)}, not {self.quantization!r}")

    @property
    def moment_dtype(self) -> str:
        """AdamW's first moment's storage: as given, else the weights'."""
        return self.first_moment_dtype or self.weight_dtype


__all__ = ["DTYPES", "PlanStep"]
