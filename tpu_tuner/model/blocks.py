"""A model's repeated blocks, found from its module tree (torch is imported only when called).

Two readings of "the blocks", kept apart because their users need different things: activation
checkpointing and the sharding layouts wrap every block of the outermost stack
(`repeated_blocks`); the planner scans the longest `ModuleList` and needs its name (`blocks_of`).
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
        return (len(members) >= 2 and len({type(m) for m in members}) == 1
                and next(members[0].children(), None) is not None)

    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if is_stack(module):
            found.extend(module.children())
            return  # the outermost stack only: its blocks' insides are not blocks of their own
        for child in module.children():
            visit(child)

    visit(model)
    return found


def blocks_of(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The repeated blocks as the planner scans them: the longest ModuleList of same-typed modules,
    with its name."""
    from torch import nn

    best: tuple[str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            if best is None or len(module) > len(best[1]):
                best = (name, module)
    if best is None:
        raise ValueError("the model has no ModuleList of repeated blocks to scale")
    return best
