"""Expert parallelism from the planner's side: the MoE's dispatched tensors pinned to the expert axis.

With the stacked expert weights split along their expert dimension over ``expert`` and the tokens
split over it as part of the batch (MaxText's ``exp`` and ``activation_batch`` rules), XLA is free
to gather the weights instead of moving the tokens: left alone it does (the same collectives as
fsdp of that size, measured on a 4-expert decoder). MaxText pins the dispatched tokens
[experts, batch, slots, width] to (``activation_exp``, ``activation_batch_no_exp``, None,
``activation_embed`` / ``activation_mlp``) in its dense_matmul (src/maxtext/layers/moe.py), which
makes the dispatch and the combine all-to-alls over ``expert``. The planner does the same without
touching the model: torchax's einsum, as the generic decoder's MixtureOfExperts calls it
(``bsm,bsec->ebcm``, ``ebcm,emh->ebch``, ``ebch,ehm->ebcm``), gets that sharding constraint on
every output indexed experts-first (``e...``, four dimensions) when the mesh has an expert axis.
A MoE written otherwise (ragged / grouped matmuls) needs its own hook: see docs/planner.md,
"The whole mesh".
"""

from __future__ import annotations

from typing import Any


def _experts_first(subscripts: str) -> bool:
    """Whether einsum subscripts index [experts, batch, slots, width] (the decoder's dispatched tokens)."""
    return len(subscripts) == 4 and subscripts[0] == "e"


def expert_dispatch(env: Any, mesh: Any) -> None:
    """Override torch.einsum in torchax's `env` (a process-wide environment: set on every compile,
    so that no mesh of an earlier compile stays) with torchax's own einsum, plus, where `mesh` has
    an expert axis of more than one device, the dispatch and combine as all-to-alls: the dispatch
    einsum (experts-first output from token-first operands) computed where the tokens are, then
    moved to the expert that owns it; the combine einsum's experts-first operand moved back to
    where its tokens are first. Einsums among experts-first tensors keep the expert split."""
    import jax
    import torch
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax.interop import jax_view, torch_view
    from torchax.ops.jtorch import _einsum

    experts = dict(mesh.shape).get("expert", 1)
    batch = tuple(a for a in ("data", "fsdp", "fsdp_transpose") if a in mesh.shape)
    # [experts, batch, slots, width]: by expert (MaxText's activation_exp x activation_batch_no_exp),
    # or by token (the batch over every axis that splits it, the expert axis included).
    by_expert = NamedSharding(mesh, PartitionSpec("expert", batch, None, "tensor"))
    by_token = NamedSharding(mesh, PartitionSpec(None, (*batch, "expert"), None, "tensor"))

    def einsum(equation: str, *operands: Any) -> Any:
        values = jax_view(operands)
        if experts > 1 and isinstance(equation, str) and "->" in equation:
            inputs, output = (part.replace(" ", "") for part in equation.split("->"))
            firsts = [_experts_first(term) and getattr(v, "ndim", 0) == 4 for term, v in zip(inputs.split(","), values)]
            if not _experts_first(output):  # the combine: back to the tokens' devices first
                values = tuple(
                    jax.lax.with_sharding_constraint(v, by_token) if first else v for v, first in zip(values, firsts)
                )
            result = _einsum(equation, *values)
            if _experts_first(output) and result.ndim == 4:
                if not any(firsts):  # the dispatch: made where the tokens are, then sent to the experts
                    result = jax.lax.with_sharding_constraint(result, by_token)
                result = jax.lax.with_sharding_constraint(result, by_expert)
            return torch_view(result)
        return torch_view(_einsum(equation, *values))

    env.override_op_definition(torch.einsum, einsum)


__all__ = ["expert_dispatch"]
