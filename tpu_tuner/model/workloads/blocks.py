"""A model's repeated blocks, found from its module tree (torch is imported only when called).

Two readings of "the blocks", kept apart because their users need different things: activation
checkpointing, regional compilation and the sharding layouts wrap every block of the outermost
stack (`repeated_blocks`, or the blocks a transformers model declares: `model_blocks`); the
planner scans the longest `ModuleList` and needs its name (`blocks_of`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, in order: the children of every outermost ModuleList /
    Sequential holding two or more modules of one class that have submodules themselves (a
    Sequential of Linear layers is not a stack of blocks)."""
    from torch import nn

    def is_stack(container: nn.Module) -> bool:
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            return False
        members = list(container.children())
        return (
            len(members) >= 2 and len({type(m) for m in members}) == 1 and next(members[0].children(), None) is not None
        )

    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if is_stack(module):
            found.extend(module.children())
            return  # the outermost stack only: its blocks' insides are not blocks of their own
        for child in module.children():
            visit(child)

    visit(model)
    return found


def declared_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks a transformers model declares whole (``_no_split_modules``), in order."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names] if names else []


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks a transformers model declares, else the outermost stack's (`repeated_blocks`)."""
    return declared_blocks(model) or repeated_blocks(model)


# Set on a block compiled on its own (`knobs/compile_scope.compile_blocks`): the options it took.
COMPILED_BLOCK_ATTR = "_tpu_tune_compiled_block"


def compiled_blocks(model: object) -> list[nn.Module]:
    """The blocks of `model` compiled on their own (regional compilation); empty for anything else."""
    from torch import nn

    if not isinstance(model, nn.Module):
        return []
    return [block for block in model_blocks(model) if getattr(block, COMPILED_BLOCK_ATTR, None) is not None]


def blocks_of(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The repeated blocks as the planner scans them, with their name: the ModuleList the model
    names in a `scanned_blocks` attribute (the generic decoder, whose layer pattern may leave
    blocks outside the repeats), else the longest ModuleList of same-typed modules."""
    from torch import nn

    named = getattr(model, "scanned_blocks", None)
    if isinstance(named, str) and isinstance(getattr(model, named, None), nn.ModuleList):
        return named, getattr(model, named)
    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if best is None or len(module) > len(best[1]):
                best = (name, module)
    if best is None:
        raise ValueError("the model has no ModuleList of repeated blocks to scale")
    return best


def unscanned_blocks(model: nn.Module, blocks_name: str) -> list[tuple[str, nn.Module]]:
    """(name, block) of the blocks beside the scanned stack `blocks_name`: the members of the other
    ModuleLists with the same parent (the generic decoder's leading and trailing layers), which
    the planner runs unrolled around the scan."""
    from torch import nn

    parent_name = blocks_name.rsplit(".", 1)[0] if "." in blocks_name else ""
    parent = model.get_submodule(parent_name) if parent_name else model
    prefix = f"{parent_name}." if parent_name else ""
    return [
        (f"{prefix}{name}.{index}", block)
        for name, stack in parent.named_children()
        if isinstance(stack, nn.ModuleList) and f"{prefix}{name}" != blocks_name
        for index, block in enumerate(stack)
    ]


def layer_count(model: nn.Module) -> int:
    """The model's transformer layers: its scanned blocks, each counted as the layers it holds (a
    `members` ModuleList: one repeat of a layer pattern), plus the blocks beside them."""
    from torch import nn

    name, blocks = blocks_of(model)
    members = getattr(blocks[0], "members", None)
    per_block = len(members) if isinstance(members, nn.ModuleList) else 1
    return per_block * len(blocks) + len(unscanned_blocks(model, name))
