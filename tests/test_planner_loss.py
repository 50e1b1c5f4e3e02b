"""The planner's cross-entropy (planner/compiler/vocab_tiling.py): MaxText's one-hot form, the same values
as picking the target logit by index, and no gather in the program it lowers to."""

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="the plan extra is not installed")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_equals_the_log_softmax_at_the_target(dtype: str) -> None:
    import jax
    import jax.numpy as jnp

    from tpu_tuner.planner.compiler.vocab_tiling import cross_entropy

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    logits = (4 * jax.random.normal(keys[0], (3, 7, 50))).astype(dtype)
    targets = jax.random.randint(keys[1], (3, 7), 0, 50)
    wide = logits.astype(jnp.float32)
    expected = -jnp.take_along_axis(jax.nn.log_softmax(wide, axis=-1), targets[..., None], axis=-1)[..., 0]
    got = cross_entropy(logits, targets)
    assert got.dtype == jnp.float32 and got.shape == (3, 7)
    assert jnp.allclose(got, expected, rtol=1e-6, atol=1e-5)


def test_cross_entropy_lowers_without_a_gather() -> None:
    """An element gather of large logits is what libtpu 0.0.42 sent to SparseCore and failed on
    (docs/planner.md, "The loss's target logit"); the one-hot product lowers to none."""
    import jax
    import jax.numpy as jnp

    from tpu_tuner.planner.compiler.vocab_tiling import cross_entropy

    logits = jax.ShapeDtypeStruct((2, 8, 1000), jnp.bfloat16)
    targets = jax.ShapeDtypeStruct((2, 8), jnp.int32)
    text = jax.jit(lambda x, t: cross_entropy(x, t).mean()).lower(logits, targets).as_text()
    assert "gather" not in text
    assert "gather" in jax.jit(lambda x, t: jnp.take_along_axis(x, t[..., None], -1)).lower(logits, targets).as_text()


def test_the_floor_counts_the_head_forward_a_tiled_loss_recomputes() -> None:
    """With the loss in vocabulary tiles the backward computes each tile's logits again (MaxText's
    vocab tiling; the planner's `jax.checkpoint` tile): the work the chips do, under the compiler's
    count, holds one more forward of the head, 2 x vocab x d_model a token."""
    from dataclasses import replace

    from helpers.tiny_planner import tiny_llama_problem

    plain = tiny_llama_problem()
    tiled = replace(plain, step=replace(plain.step, vocab_tiling=4))
    shape, tokens = plain.dims.shape, plain.step.global_batch * plain.step.seq_len
    for remat in ("full", "minimal"):
        more = tiled.hardware_flops(remat) - plain.hardware_flops(remat)
        assert more == 2 * shape.vocab * shape.d_model * tokens
