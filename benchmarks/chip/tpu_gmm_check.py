"""Grouped matmuls against a dense matmul of the same FLOPs, on a TPU chip (JAX only).

The planner times megablox's grouped matmuls (forward ``gmm``, the input gradient ``gmm`` with the
weights transposed, the weights' gradient ``tgmm``) at the dense matmuls' MXU efficiency
(docs/planner.md, "39 rows since 2026-12-04 late"). This measures on a chip what each kernel
reaches, at the planner's tiles, for a device's rows of the dropless MoE calibration runs, beside
one dense [rows, k] x [k, n] product of the same 2 m k n FLOPs. Routing is balanced (the runs'
``use_random_routing``): each expert gets rows / experts rows.

    python benchmarks/chip/tpu_gmm_check.py --out DIR --shape NAME,ROWS,K,N,EXPERTS,TM,TK,TN ...

TM, TK, TN: the tiles as ``planner/compiler/grouped_matmul.py`` picks them for the shape (its ``_tile``).
Prints one line a shape and kernel and writes ``DIR/gmm_check.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any


def _seconds(fn: Any, *args: Any, repeats: int = 10) -> float:
    """Median wall time of `fn(*args)` over `repeats` runs after a compile and a warm-up run."""
    fn(*args).block_until_ready()
    fn(*args).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check(name: str, rows: int, k: int, n: int, experts: int, tiles: tuple[int, int, int]) -> dict[str, Any]:
    """Each kernel's seconds and TFLOP/s for one shape, and the dense product's."""
    import importlib

    import jax
    import jax.numpy as jnp

    # The kernels' module (the package's `gmm` name is a function), as planner/compiler/grouped_matmul.py takes it.
    kernels = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    lhs = jax.random.normal(keys[0], (rows, k), jnp.bfloat16)
    rhs = jax.random.normal(keys[1], (experts, k, n), jnp.bfloat16)
    sizes = jnp.full((experts,), rows // experts, jnp.int32)
    flops = 2.0 * rows * k * n
    tm, tk, tn = tiles
    ops = {
        "dense": (jax.jit(lambda a, b: a @ b[0]), (lhs, rhs)),
        "gmm": (jax.jit(lambda a, b, s: kernels.gmm(a, b, s, jnp.bfloat16, (tm, tk, tn))), (lhs, rhs, sizes)),
    }
    out = {"name": name, "rows": rows, "k": k, "n": n, "experts": experts, "tiles": list(tiles), "flops": flops}
    for op, (fn, args) in ops.items():
        seconds = _seconds(fn, *args)
        out[op] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
    grad = jax.random.normal(keys[2], (rows, n), jnp.bfloat16)
    del ops, lhs  # HBM for the next kernel's operands (one v5e chip holds 15.7 GiB)
    transposed = jax.jit(lambda g, b, s: kernels.gmm(g, b, s, jnp.bfloat16, (tm, tn, tk), transpose_rhs=True))
    seconds = _seconds(transposed, grad, rhs, sizes)
    out["gmm_transposed"] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
    del rhs
    lhs_t = jax.random.normal(keys[0], (k, rows), jnp.bfloat16)
    weight_grad = jax.jit(lambda a, g, s: kernels.tgmm(a, g, s, jnp.bfloat16, (tm, tk, tn)))
    seconds = _seconds(weight_grad, lhs_t, grad, sizes)
    out["tgmm"] = {"seconds": seconds, "tflops": flops / seconds / 1e12}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", required=True, help="NAME,ROWS,K,N,EXPERTS,TM,TK,TN")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import jax

    shapes: list[dict[str, Any]] = []
    results = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "shapes": shapes}
    for spec in args.shape:
        name, *numbers = spec.split(",")
        rows, k, n, experts, tm, tk, tn = (int(x) for x in numbers)
        result = check(name, rows, k, n, experts, (tm, tk, tn))
        shapes.append(result)
        for op in ("dense", "gmm", "gmm_transposed", "tgmm"):
            figures = result[op]
            print(f"{name} {op}: {figures['seconds'] * 1e3:.2f} ms, {figures['tflops']:.1f} TFLOP/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gmm_check.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
