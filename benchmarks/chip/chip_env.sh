# Sourced on a lent TPU host from the repository's root: TorchTPU installed once a machine, then the
# environment the chip benchmarks run in (docs/torchtpu.md, "The next chip session, in order").
#   source benchmarks/chip/chip_env.sh INSTALLER STAGE
# INSTALLER: the offline installer carried in (it prints the PYTHONPATH line last); STAGE: the folder
# holding its parts. transformers 5.17.0 (for hf: models) and flatbuffers (JAX's exported programs)
# come from the host's own package index into /tmp/hf.
installer=${1:?usage: source chip_env.sh INSTALLER STAGE}; stage=${2:?usage: source chip_env.sh INSTALLER STAGE}
if [ ! -s /tmp/torchtpu-pythonpath.sh ]; then
  bash "$installer" "$stage" | tail -n 1 > /tmp/torchtpu-pythonpath.sh
  python3 -m pip install --isolated -q --only-binary=:all: --index-url file:///opt/pypi/simple \
    --target /tmp/hf transformers==5.17.0 flatbuffers
  rm -rf /tmp/hf/numpy* /tmp/hf/torch* /tmp/hf/jax*  # the host's numpy and JAX, the installer's torch
fi
. /tmp/torchtpu-pythonpath.sh
export PYTHONPATH=$PYTHONPATH:/tmp/hf:$(pwd)
export TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT=/tmp/tpucache  # the benchmarks' compiles kept across calls
