"""The planner's flash attention kernel timed on a TPU chip, by head width, sequence and block size.

The planner costs a step's attention from these timings on the generation that timed them
(tpu_tuner/planner/prediction/attention_kernel.py; docs/planner.md, "On a real chip"):

    python benchmarks/chip/tpu_attention_kernel.py time [--out results/tpu_check/attn]    # on the chip, JAX only
    python benchmarks/chip/tpu_attention_kernel.py adopt [--out results/tpu_check/attn]   # here: keep them

`time` needs JAX and nothing of this project (no torch); `adopt` writes the timings into the
planner's chip_kernels.json under the chip's generation, with its date, JAX and libtpu.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def attention_blocks(
    out: Path,
    head_dims: tuple[int, ...] = (64, 128, 256),
    seqs: tuple[int, ...] = (1024, 2048, 4096, 8192),
    blocks: tuple[int, ...] = (128, 256, 512, 1024),
    work_tokens: int = 8 * 16 * 2048,
) -> None:
    """On the chip: causal attention through the planner's kernel (Pallas flash attention, the
    planner's `BlockSizes`: one size for every forward and backward block) for every head width,
    sequence and block size given: the forward alone, and the forward then the backward from a
    given cotangent (`jax.vjp`: what a step that recomputes attention runs in its backward pass), so
    a step's attention can be costed as forward x (1 + recomputed) + backward. Batch x heads is
    chosen so every point holds `work_tokens` query rows; heads 16 wide of 64, 8 of 128 (a
    decoder's d_model 1024 either way). Rows into attention_blocks.json with the chip, JAX and
    libtpu versions, beside the step checks' records."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import flash_attention as flash

    rows = []
    for head_dim in head_dims:
        heads = 1024 // head_dim
        for seq in seqs:
            batch = max(1, work_tokens // (heads * seq))
            shape = (batch, heads, seq, head_dim)
            q, k, v, cotangent = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i in range(4))
            causal_flops = 2 * batch * heads * seq * seq * head_dim  # forward, causal: half of 4bhs^2d
            for block in (b for b in blocks if seq % b == 0):
                sizes = flash.BlockSizes(*(block,) * 3, 1, *(block,) * 7)

                def attend(q: Any, k: Any, v: Any, sizes: Any = sizes, scale: float = head_dim**-0.5) -> Any:
                    return flash.flash_attention(q, k, v, causal=True, sm_scale=scale, block_sizes=sizes)

                def backward(q: Any, k: Any, v: Any, cotangent: Any, attend: Any = attend) -> Any:
                    # As a remat step's backward pass runs it: the forward again, then the
                    # backward kernels from the output's cotangent (no loss of its own).
                    return jax.vjp(attend, q, k, v)[1](cotangent)

                row: dict[str, Any] = {"head_dim": head_dim, "seq": seq, "block": block, "batch": batch, "heads": heads}
                for name, program, args in (
                    ("forward", jax.jit(attend), (q, k, v)),
                    ("forward_backward", jax.jit(backward), (q, k, v, cotangent)),
                ):
                    try:
                        row[f"{name}_ms"] = _time_ms(jax, program, args)
                    except Exception as error:  # a block the kernel refuses at this shape: said, not fatal
                        row[f"{name}_error"] = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
                if "forward_ms" in row:
                    row["forward_tflops"] = causal_flops / row["forward_ms"] / 1e9
                rows.append(row)
                print(json.dumps(row))
    record = {
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "libtpu": libtpu_version(),
        "date": time.strftime("%Y-%m-%d"),
        "kernel": "jax.experimental.pallas.ops.tpu.flash_attention, causal, BlockSizes(b, b, b, 1, b x 7)",
        "rows": rows,
    }
    (out / "attention_blocks.json").write_text(json.dumps(record, indent=1))


def _time_ms(jax: Any, program: Any, args: tuple[Any, ...], repeats: int = 10) -> float:
    """Milliseconds a call of `program` takes, after a first call that compiles it."""
    jax.block_until_ready(program(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        result = program(*args)
    jax.block_until_ready(result)
    return (time.perf_counter() - start) / repeats * 1e3


def libtpu_version() -> str | None:
    """The installed libtpu's version (its distribution's name differs between releases)."""
    from importlib import metadata

    for name in ("libtpu", "libtpu-nightly"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


# JAX's device_kind of each generation's chip (the planner's generation names: core/hardware.py).
GENERATION_OF_DEVICE = {"TPU v5 lite": "v5e", "TPU v6 lite": "v6e", "TPU v5": "v5p", "TPU v4": "v4", "TPU7x": "tpu7x"}


def adopt(out: Path) -> None:
    """Keep the kernel timings of `out`/attention_blocks.json as the planner's for that chip's
    generation (tpu_tuner/planner/prediction/chip_kernels.json, attention_kernel.py), beside any
    other generation's: the prediction then costs attention on that generation from them."""
    from tpu_tuner.planner.prediction.attention_kernel import KERNELS_FILE

    record = json.loads((out / "attention_blocks.json").read_text())
    generation = GENERATION_OF_DEVICE[record["device"]]
    kept = json.loads(KERNELS_FILE.read_text()) if KERNELS_FILE.exists() else {}
    kept[generation] = record
    KERNELS_FILE.write_text(json.dumps(kept, indent=1) + "\n")
    print(f"{generation}: {len(record['rows'])} kernel timings kept in {KERNELS_FILE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("time", "adopt"))
    parser.add_argument("--out", type=Path, default=REPO / "results" / "tpu_check" / "attn")
    args = parser.parse_args()
    if args.what == "time":
        args.out.mkdir(parents=True, exist_ok=True)
        attention_blocks(args.out)
    else:
        adopt(args.out)


if __name__ == "__main__":
    main()
