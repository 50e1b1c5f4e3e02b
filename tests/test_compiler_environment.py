"""The planner's compiler processes never take a TPU chip: compile-only topologies need none, and on
a TPU host a process that starts JAX's TPU platform opens the chip, which one process at a time may
hold (on a v5e host every compile failed "open(/dev/vfio/N): Device or resource busy" while
another process held it)."""

from __future__ import annotations

import os
import subprocess
import sys

from tpu_tuner.planner.compiler.compile_pool import compiler_environment


def test_compiler_processes_run_jax_on_its_cpu_platform_unless_the_user_chose_one() -> None:
    assert compiler_environment({}) == {"JAX_PLATFORMS": "cpu"}
    assert compiler_environment({"JAX_PLATFORMS": "tpu,cpu"}) == {}  # the user's choice stands


def test_a_topology_compiles_on_the_cpu_platform_alone() -> None:
    # What a compiler process does first: the TPU topology's devices, with JAX's platform CPU.
    code = (
        "import jax\n"
        "from tpu_tuner.planner.compiler.compile_request import topology_devices\n"
        "devices = topology_devices('v5e:2x2')\n"
        "print(len(devices), jax.default_backend())\n"
    )
    env = {**os.environ, **compiler_environment({})}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split()[-2:] == ["4", "cpu"], out.stderr[-2000:]
