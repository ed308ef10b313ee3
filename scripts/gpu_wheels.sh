#!/usr/bin/env bash
# Download into .whl/ the wheels that scripts/gpu_check.sh needs on the lent GPU machine (Python 3.12, x86-64
# manylinux, no network there). The list is computed, not typed: the runtime dependencies in pyproject.toml and
# theirs (read from the installed distributions' metadata, markers evaluated for CPython 3.12 on Linux), less
# what that machine's image already holds (PRESENT, as the device notes' package list gives it) and less SKIP
# (not imported by the check: W&B stays disabled and no video is written). Each is pinned to the version
# installed here, the one the project is tested with.
#
#   bash scripts/gpu_wheels.sh          # then run the check with carry [".whl"]; .whl/ is git-ignored
#   PYTHON=.venv/bin/python DEST=.whl bash scripts/gpu_wheels.sh
#   LIST_ONLY=1 bash scripts/gpu_wheels.sh   # print the NAME==VERSION list and download nothing
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && python=.venv/bin/python
dest=${DEST:-.whl}

# The image's Python packages (device notes, "Python packages already there", read 2026-11-17).
PRESENT="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions
nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp"
# Not imported by the check: wandb (log.wandb.mode=disabled) and imageio-ffmpeg (videos only).
SKIP=${SKIP:-"wandb imageio-ffmpeg"}

list=$(PRESENT="$PRESENT" SKIP="$SKIP" "$python" - <<'EOF'
import os
import tomllib
import importlib.metadata as md
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
present = {canonicalize_name(n) for n in os.environ["PRESENT"].split()}
skip = {canonicalize_name(n) for n in os.environ["SKIP"].split()}
todo = [Requirement(r) for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]]
need: dict[str, str] = {}
while todo:
    req = todo.pop()
    name = canonicalize_name(req.name)
    if (req.marker and not req.marker.evaluate(env)) or name in present or name in skip or name in need:
        continue
    try:
        dist = md.distribution(req.name)
    except md.PackageNotFoundError:
        raise SystemExit(f"gpu_wheels: {req.name} is not installed here (install the project first)")
    need[name] = dist.version
    todo += [Requirement(r) for r in dist.requires or []]
print("\n".join(f"{n}=={v}" for n, v in sorted(need.items())))
EOF
)
echo "gpu_wheels: needed on the GPU machine (not in its image):" "${list//$'\n'/ }"
[ -n "${LIST_ONLY:-}" ] && exit 0

mkdir -p "$dest"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for spec in $list; do
  # pip matches manylinux_2_N exactly: retry with the newer glibc tags wheels are often built for
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" -d "$dest" "$spec" 2>/dev/null \
  || "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${plat[@]}" --platform manylinux_2_24_x86_64 --platform manylinux_2_31_x86_64 \
      --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 -d "$dest" "$spec" \
  || { echo "gpu_wheels: no Python 3.12 manylinux wheel for $spec"; exit 1; }
done
du -b "$dest"/*.whl | awk -v dest="$dest" '{printf "%8.1f MB  %s\n", $1 / 1e6, $2; total += $1}
  END {printf "gpu_wheels: %.1f MB in %s (the working tree and carried paths: 64 MiB at most)\n", total / 1e6, dest}'
