"""Rematerialisation policies by MaxText's names, and the block tensors they name.

A policy says, for each named tensor of a decoder block, whether the backward pass finds it
saved in HBM ("device"), in the host's memory ("offload"), or recomputes it ("remat"). MaxText
names the tensors inside its layers with `checkpoint_name`; a user's PyTorch block carries no
names, so `block_tensor_roles` finds them from the block's structure (the same shapes
`model.meshes.layouts.placements` reads), and the compiled program names the outputs of those linears.

Names (MaxText's): ``decoder_layer_input`` (the block's input, the scan carry), ``query_proj``,
``key_proj``, ``value_proj``, ``qkv_proj`` (a fused projection), ``context`` (the attention's
output, the out projection's input), ``out_proj``, ``mlpwi_0`` / ``mlpwi_1`` (the gate and up
projections of a gated MLP; a plain MLP has ``mlpwi_0`` only), ``mlpwo`` (the down projection).

A policy is written as MaxText's configuration does: a named policy (``full``, ``minimal``,
``save_qkv_proj``, ``qkv_proj_offloaded``, ...) or ``custom:`` followed by ``name=action`` pairs,
e.g. ``custom:decoder_layer_input=offload,query_proj=offload`` (unnamed tensors: ``remat``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from tpu_tuner.core.errors import UserInputError

BLOCK_INPUT = "decoder_layer_input"
_QKV = ("query_proj", "key_proj", "value_proj", "qkv_proj")
WEIGHT_MATMULS = (*_QKV, "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
TENSOR_NAMES = (BLOCK_INPUT, *_QKV, "context", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
ACTIONS = ("remat", "device", "offload")

# MaxText's named policies as (saved on device, offloaded to host, every weight matmul's output:
# None, "device" or "offload"). "minimal" saves the outputs of every matmul without batch
# dimensions (jax's checkpoint_dots_with_no_batch_dims: the weight matmuls, not attention's), as
# MaxText did when the calibration rows were published; since August 2025 MaxText lists the same
# matmuls by name instead. MaxText tags query and key after the rotary embedding; here they are
# the projections' outputs, the same size.
NAMED_POLICIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], str | None]] = {
    "full": ((), (), None),
    "minimal": ((), (), "device"),
    "minimal_flash": (("context",), (), "device"),
    "minimal_with_context": (("context",), (), "device"),
    "minimal_offloaded": ((), (), "offload"),
    "save_dot_with_context_except_mlp": ((*_QKV, "context", "out_proj"), (), None),
    "save_dot_except_mlpwi": ((*_QKV, "out_proj", "mlpwo"), (), None),
    "save_dot_except_mlp": ((*_QKV, "out_proj"), (), None),
    "save_qkv_proj": (_QKV, (), None),
    "save_out_proj": (("out_proj",), (), None),
    "qkv_proj_offloaded": ((), ("query_proj", "key_proj", "value_proj"), None),
}
# Not MaxText's: "none" keeps everything (no checkpoint); "offload" is kept as another name for
# full remat with the block input in host memory (MaxText: custom, decoder_layer_input offload).
ALIASES = {"offload": "custom:decoder_layer_input=offload"}


@dataclass(frozen=True)
class RematPolicy:
    """What the backward pass keeps of each named block tensor."""

    name: str  # as written: "full", "save_qkv_proj", "custom:decoder_layer_input=offload,..."
    saved: frozenset[str] = frozenset()  # kept in HBM
    offloaded: frozenset[str] = frozenset()  # kept in host memory
    weight_matmuls: str | None = None  # "device" / "offload": every weight matmul's output (minimal)
    keep_all: bool = False  # "none": no rematerialisation at all

    def action(self, tensor: str) -> str:
        """ "device", "offload" or "remat" for a named tensor."""
        if self.keep_all or tensor in self.saved:
            return "device"
        if tensor in self.offloaded:
            return "offload"
        if self.weight_matmuls and tensor in WEIGHT_MATMULS:
            return self.weight_matmuls
        return "remat"

    @property
    def offloads(self) -> bool:
        return bool(self.offloaded) or self.weight_matmuls == "offload"

    @property
    def family(self) -> str:
        """The policy's family, what the error band compares (planner/prediction/band.py): "offload" (any
        tensor in host memory), "minimal" (every weight matmul kept), "full" (only the scan's
        block input kept), "device" (some named tensors kept in HBM), "none" (nothing recomputed)."""
        if self.keep_all:
            return "none"
        if self.offloads:
            return "offload"
        if self.weight_matmuls == "device":
            return "minimal"
        return "device" if self.saved - {BLOCK_INPUT} else "full"

    def jax_policy(self) -> Any:
        """The jax.checkpoint policy (None: no checkpoint, everything kept)."""
        import jax

        policies = jax.checkpoint_policies
        if self.keep_all:
            return None
        names = dict(
            names_which_can_be_saved=sorted(self.saved),
            names_which_can_be_offloaded=sorted(self.offloaded),
            offload_src="device",
            offload_dst="pinned_host",
        )
        if self.weight_matmuls is None:
            if not self.saved and not self.offloaded:
                return policies.nothing_saveable
            return policies.save_and_offload_only_these_names(**names)
        dots = (
            policies.offload_dot_with_no_batch_dims("device", "pinned_host")
            if self.weight_matmuls == "offload"
            else policies.dots_with_no_batch_dims_saveable
        )
        if not self.saved and not self.offloaded:
            return dots
        return policies.save_from_both_policies(dots, policies.save_and_offload_only_these_names(**names))


def parse_remat(text: str, where: str = "--remat") -> RematPolicy:
    """A policy from its written form; a one-line UserInputError naming `where` when it is not one."""
    text = ALIASES.get(text.strip(), text.strip())
    if text == "none":
        return RematPolicy("none", keep_all=True)
    if text in NAMED_POLICIES:
        saved, offloaded, dots = NAMED_POLICIES[text]
        return RematPolicy(text, frozenset(saved), frozenset(offloaded), dots)
    if not text.startswith("custom:"):
        known = ", ".join(["none", *NAMED_POLICIES, "custom:NAME=ACTION,..."])
        raise UserInputError(f"unknown remat policy {text!r} (known: {known})", where)
    saved_names: set[str] = set()
    offloaded_names: set[str] = set()
    for pair in filter(None, (p.strip() for p in text[len("custom:") :].split(","))):
        tensor, _, action = pair.partition("=")
        if tensor not in TENSOR_NAMES or action not in ACTIONS:
            raise UserInputError(
                f"custom remat takes NAME=ACTION with NAME one of {', '.join(TENSOR_NAMES)} and "
                f"ACTION one of {', '.join(ACTIONS)}, not {pair!r}",
                where,
            )
        (saved_names if action == "device" else offloaded_names if action == "offload" else set()).add(tensor)
    canonical = "custom:" + ",".join(
        f"{t}={'device' if t in saved_names else 'offload'}"
        for t in TENSOR_NAMES
        if t in saved_names or t in offloaded_names
    )
    return RematPolicy(canonical, frozenset(saved_names), frozenset(offloaded_names))


def block_tensor_roles(block: nn.Module, d_model: int, mlp_hidden: int) -> tuple[dict[str, str], tuple[str, ...]]:
    """(submodule path -> name of its output, the submodule paths whose input is ``context``: one
    per attention, several in one repeat of a layer pattern).

    Found from the block's structure: the module holding three or more linears that read the
    residual width (or one fused projection) is the attention: its linears in registration order
    are query, key, value (one: qkv_proj), and the one writing the residual width is out_proj; the
    module with a linear reading the MLP width is the MLP: its linears reading the residual width
    are mlpwi_0 (gate) and mlpwi_1 (up), the one writing it mlpwo. A block that matches neither
    gets no names (its policies then act on the block input alone), and so does a module holding
    more than one linear that writes the residual width (attention and MLP side by side).
    `mlp_hidden` is `mlp_width(block, d_model)`."""
    roles: dict[str, str] = {}
    context_of: list[str] = []
    for parent_name, parent in block.named_modules():
        declared = getattr(parent, "tensor_roles", None)  # a module that names its own (latent attention)
        if isinstance(declared, dict):
            for child, role in declared.items():
                path = f"{parent_name}.{child}" if parent_name else child
                roles[path] = role
                if role == "out_proj":
                    context_of.append(path)
            continue
        linears = [
            (f"{parent_name}.{n}" if parent_name else n, m)
            for n, m in parent.named_children()
            if isinstance(m, nn.Linear)
        ]
        reading = [
            (n, m)
            for n, m in linears
            if m.in_features == d_model
            and m.out_features != d_model
            or m.in_features == d_model
            and m.out_features == d_model
            and (n, m) != linears[-1]
        ]
        writing = [(n, m) for n, m in linears if m.out_features == d_model and (n, m) not in reading]
        if len(writing) > 1 or len(reading) > 3:
            continue  # attention and MLP in one module (a flat block): nothing is named, not misnamed
        is_mlp = (
            any(m.in_features == mlp_hidden and m.out_features == d_model for _, m in writing) and len(reading) <= 2
        )
        if is_mlp:
            for index, (name, _) in enumerate(reading):
                roles[name] = f"mlpwi_{index}"
            roles[writing[-1][0]] = "mlpwo"
        elif len(reading) >= 3 or (len(reading) == 1 and writing):
            if len(reading) == 1:
                roles[reading[0][0]] = "qkv_proj"
            else:
                for name, role in zip(reading, ("query_proj", "key_proj", "value_proj")):
                    roles[name[0]] = role
            if writing:
                roles[writing[-1][0]] = "out_proj"
                context_of.append(writing[-1][0])
    return roles, tuple(context_of)


def mlp_width(block: nn.Module, d_model: int) -> int:
    """The MLP's hidden width: the widest input among the block's linears that write d_model."""
    widths = [m.in_features for m in block.modules() if isinstance(m, nn.Linear) and m.out_features == d_model]
    return max(widths, default=d_model)


def forward_flops_per_token(
    policy: RematPolicy,
    d_model: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    mlp_hidden: int,
    gated: bool,
    seq_len: float,  # the keys a query attends: fewer than the sequence for a local layer
    mlp_output_needed: bool = True,
) -> tuple[float, float]:
    """(a block's forward FLOPs per token, of which the backward pass recomputes under `policy`).

    A tensor not kept is recomputed by its producer: a weight matmul, or for ``context`` the
    attention itself (full attention counted, as the chips do it). The floor under the compiler's
    FLOPs count (predict.py) adds the recomputed part to 3x the forward.

    The MLP's down-projection (``mlpwo``) is recomputed only where the backward pass reads its
    output (`mlp_output_needed`): a norm after the MLP, an MoE combine weighted by the router,
    Gemma 4's per-layer gate on the block's output. Where it only enters the residual sum, whose
    gradient passes through unchanged, nothing in the backward pass reads it: its gradients need
    its input and the incoming gradient alone, so the rematerialised forward is dead code there
    (jax.checkpoint's partial evaluation and XLA both drop it). Charging it anyway put a third of
    a full-remat step's recompute on the v4 and v5e rows that the chips never ran (issue 70)."""
    parts = {
        "query_proj": 2 * d_model * heads * head_dim,
        "key_proj": 2 * d_model * kv_heads * head_dim,
        "value_proj": 2 * d_model * kv_heads * head_dim,
        "context": 4 * seq_len * heads * head_dim,
        "out_proj": 2 * heads * head_dim * d_model,
        "mlpwi_0": 2 * d_model * mlp_hidden,
        "mlpwi_1": 2 * d_model * mlp_hidden if gated else 0,
        "mlpwo": 2 * mlp_hidden * d_model,
    }
    dead = set() if mlp_output_needed else {"mlpwo"}
    recomputed = sum(f for name, f in parts.items() if policy.action(name) == "remat" and name not in dead)
    return float(sum(parts.values())), float(recomputed)
