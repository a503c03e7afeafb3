#!/usr/bin/env bash
# Wheels for the offline GPU machine (Python 3.12, with CUDA torch, triton, einops and transformers):
#   - megatron-core 0.16.1, its cp312 binary wheel, for the megatron backend;
#   - mamba-ssm built from its sdist without CUDA extensions: a pure-Python wheel whose Mamba-2
#     Triton kernels run on the GPU (fp4repro.model._mamba_ssm lets it import without the Mamba-1
#     extension). 2.3.x, because 2.2.x imports names that transformers 5 no longer has.
#   - jsonschema and its three dependencies (config validation), rpds-py as a cp312 binary;
#   - lm-eval 0.4.13 and what it needs that the GPU image lacks, all pure Python (the image has
#     pyarrow, pandas, scikit-learn, sacrebleu, transformers and huggingface-hub), for `fp4repro
#     evaluate`'s downstream tasks; sdists (sqlitedict; rouge-score, word2number) are built here into
#     universal wheels. lm-eval's wheel is rewritten without its bundled task folders
#     (scripts/wheel_without_folders.py), 9 MB to 0.3 MB of what travels to the machine: the small
#     studies evaluate task folders fp4repro writes itself. nltk, rouge-score and word2number are
#     then left out too (1.8 MB: only bundled tasks' metrics import them). LM_EVAL_TASKS=keep keeps
#     all of it, for lm-eval's own tasks (paper8b's) on a machine whose dataset cache was filled
#     where there is network. On a second run pip finds the rewritten wheel under the original's
#     name, warns of a bad hash and downloads it again: expected.
# Needs network access and a Python with torch (any build, nothing is compiled: mamba-ssm's
# setup.py only imports torch, hence --no-build-isolation); by default the project's .venv.
# Usage: scripts/prepare_gpu_wheels.sh [OUT_DIR]        (default: wheels/; PYTHON=... to override;
#        LM_EVAL_TASKS=keep for lm-eval's bundled tasks)
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

"$python" -m pip download --dest "$out" --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1

"$python" -m pip download --dest "$out" --no-deps --only-binary=:all: --python-version 3.12 \
    lm-eval==0.4.13 datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 more-itertools==11.2.1 \
    pytablewriter==1.2.1 dataproperty==1.1.1 mbstrdecoder==1.1.5 pathvalidate==3.3.1 \
    tabledata==1.3.5 tcolorpy==0.1.7 typepy==1.3.5 chardet==6.0.0.post1
"$python" -m pip wheel --wheel-dir "$out" --no-deps sqlitedict==2.1.0

if [ "${LM_EVAL_TASKS:-drop}" = keep ]; then
    "$python" -m pip download --dest "$out" --no-deps --only-binary=:all: --python-version 3.12 nltk==3.10.4
    "$python" -m pip wheel --wheel-dir "$out" --no-deps rouge-score==0.1.2 word2number==1.1
else
    tmp="$(mktemp -d)"
    "$python" "$repo/scripts/wheel_without_folders.py" "$out"/lm_eval-0.4.13-py3-none-any.whl "$tmp" lm_eval/tasks/
    mv "$tmp"/lm_eval-0.4.13-py3-none-any.whl "$out"/ && rmdir "$tmp"
fi

ls -l "$out"
