#!/usr/bin/env bash
# Wheels for the offline GPU machine (Python 3.12, with CUDA torch, triton, einops and transformers):
#   - megatron-core 0.16.1, its cp312 binary wheel, for the megatron backend;
#   - mamba-ssm built from its sdist without CUDA extensions: a pure-Python wheel whose Mamba-2
#     Triton kernels run on the GPU (fp4repro.model._mamba_ssm lets it import without the Mamba-1
#     extension). 2.3.x, because 2.2.x imports names that transformers 5 no longer has.
# Needs network access and a Python with torch (any build, nothing is compiled: mamba-ssm's
# setup.py only imports torch, hence --no-build-isolation); by default the project's .venv.
# Usage: scripts/prepare_gpu_wheels.sh [OUT_DIR]        (default: wheels/; PYTHON=... to override)
# Then, on the GPU machine: pip install --no-deps OUT_DIR/*.whl
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-wheels}"
python="${PYTHON:-$repo/.venv/bin/python}"
"$python" -c "import torch" || { echo "$python has no torch: set PYTHON to one that has" >&2; exit 1; }
mkdir -p "$out"

"$python" -m pip download --dest "$out" --no-deps --only-binary=:all: --python-version 3.12 \
    megatron-core==0.16.1

MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE \
    "$python" -m pip wheel --wheel-dir "$out" --no-deps --no-build-isolation --no-binary mamba-ssm \
    mamba-ssm==2.3.2.post1

ls -l "$out"
