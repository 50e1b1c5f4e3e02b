"""The accuracy guardrail's sample against the whole, on the device: where a setting's error lives.

Issue 68 (2026-12-07, the chip): with the guardrail comparing a 2^20-element sample of the
gradients (execution/accuracy.py, `sampled`), the Llama-class `hf:llama` model's bf16-parameter
trials read 0.304 against fp32 (its baseline 0.019) and the 335M decoder's 0.098. On a CPU host,
at the Llama shape (batch 1 x 2048), this script's figures said the sample was right (whole 0.298,
sample 0.297) and the per-parameter shares pointed at every layer alike: the knob had rounded
RoPE's frequencies to bf16 (fixed in knobs/param_dtype.py). Kept as the check of a sample against
the whole on any device, for each setting of `SETTINGS`:

- its gradients' relative error against the fp32 reference, from the whole gradients read back
  one parameter at a time (the guardrail before sampling);
- the same from the guardrail's stratified sample, gathered on the device in the gradient's own
  dtype (what the guardrail does), and gathered after a cast to float32 on the device;
- the same from the sample the chip run used, each parameter's share by its size (`by_size`);
- the parameters that carry most of the difference (their share of the squared difference).

    python benchmarks/chip/tpu_guardrail_sample.py --device tpu                   # the Llama-class model
    python benchmarks/chip/tpu_guardrail_sample.py --device cpu --model examples/gpt.py --batch-size 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LLAMA = (
    "hf:llama?num_hidden_layers=6,hidden_size=2048,intermediate_size=5632,num_attention_heads=16,"
    "num_key_value_heads=4,vocab_size=32000"
)
# Knob values over the reference (fp32 eager): None is the device's baseline.
SETTINGS: dict[str, dict[str, str] | None] = {
    "baseline": None,
    "autocast bf16": {"autocast": "bfloat16"},
    "bf16 parameters": {"param_dtype": "bfloat16"},
    "bf16 parameters + autocast": {"param_dtype": "bfloat16", "autocast": "bfloat16"},
}


def gradients(workload: Any, backend: Any, candidate: Any, batch_size: int, seq: int | None) -> dict[str, Any]:
    """The candidate's first-step gradients on the device, by parameter name (nothing read back)."""
    from tpu_tuner.execution.step import accumulate_gradients, micro_batches, prepare_step

    with candidate.process(backend):
        step = prepare_step(workload, backend, candidate, batch_size, seq)
        inputs, target = step.batch
        slices = micro_batches(inputs, target, candidate.micro_batches(backend), workload)
        accumulate_gradients(step.loss, slices, lambda: candidate.step(backend))
    return {name: p.grad.detach().flatten() for name, p in step.model.named_parameters() if p.grad is not None}


def by_size(pieces: list[Any], limit: int) -> Any:
    """The guardrail's first sample (9649ae3): each piece's share of `limit` by its size, unscaled."""
    import torch

    total = sum(piece.numel() for piece in pieces)
    chosen = []
    for place, piece in enumerate(pieces):
        count = max(1, round(limit * piece.numel() / total))
        index = torch.randint(piece.numel(), (count,), generator=torch.Generator().manual_seed(place))
        chosen.append(piece[index.to(piece.device)].float())
    return torch.cat(chosen).cpu()


def errors(got: dict[str, Any], reference: dict[str, Any], reference_cpu: dict[str, Any]) -> dict[str, Any]:
    """The whole's, the native-dtype sample's and the float32-gathered sample's relative errors."""
    import torch

    from tpu_tuner.execution.accuracy import SAMPLE, _relative, sampled

    names = list(reference)
    whole = {name: got[name].float().cpu() for name in names}  # one parameter read back at a time
    diff = {name: (whole[name].double() - reference_cpu[name].double()).square().sum().item() for name in names}
    ref_sq = sum(reference_cpu[name].double().square().sum().item() for name in names)
    total = sum(diff.values())
    native = _relative(sampled([got[n] for n in names]), sampled([reference[n] for n in names]))
    old = _relative(by_size([got[n] for n in names], SAMPLE), by_size([reference[n] for n in names], SAMPLE))
    as_float = _relative(sampled([got[n].float() for n in names]), sampled([reference[n].float() for n in names]))
    shares = sorted(((value / total if total else 0.0, name) for name, value in diff.items()), reverse=True)
    return {
        "whole": (total / ref_sq) ** 0.5 if ref_sq else float("nan"),
        "sample": native,
        "sample_gathered_fp32": as_float,
        "sample_by_size": old,
        "dtype": str(next(iter(got.values())).dtype),
        "largest shares of the difference": [
            {"parameter": name, "share": share, "error": _relative(whole[name], reference_cpu[name])}
            for share, name in shares[:6]
        ],
        "finite": all(bool(torch.isfinite(t).all()) for t in whole.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=LLAMA)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq", type=int, default=None, help="default: the workload's own (2048: the default model)")
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out", type=Path, default=Path("guardrail_sample.json"))
    args = parser.parse_args(argv)

    from tpu_tuner.devices import get_backend
    from tpu_tuner.execution.accuracy import REFERENCE
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.model.workloads.loader import load_workload

    backend = get_backend(args.device)
    workload = load_workload(args.model)
    seq = args.seq or (2048 if args.model == LLAMA else None)
    started = time.perf_counter()
    reference = gradients(workload, backend, REFERENCE, args.batch_size, seq)
    reference_cpu = {name: grad.float().cpu() for name, grad in reference.items()}
    result: dict[str, Any] = {"model": args.model, "batch_size": args.batch_size, "seq": seq, "settings": {}}
    for name in args.only:
        knobs = SETTINGS[name]
        candidate = Candidate.baseline(backend.kind) if knobs is None else Candidate(knobs)
        got = gradients(workload, backend, candidate, args.batch_size, seq)
        result["settings"][name] = {"candidate": candidate.to_dict(), **errors(got, reference, reference_cpu)}
        del got
        row = result["settings"][name]
        print(
            f"{name:28s} whole {row['whole']:.4g}  sample {row['sample']:.4g}  gathered in fp32 "
            f"{row['sample_gathered_fp32']:.4g}  by size {row['sample_by_size']:.4g}  ({row['dtype']})",
            flush=True,
        )
        for part in row["largest shares of the difference"][:3]:
            print(f"    {part['parameter']}: {part['share']:.1%} of the difference, its error {part['error']:.3g}")
    result["wall_s"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
