#!/usr/bin/env bash
# Create the GPU rehearsal's virtualenv with exactly the image's Python stack, read from
# eks_pd_serving/versions.py (IMAGE_PYTHON_STACK). Usage: rehearsal/gpu_install.sh <venv>
# Needs a Linux machine with an NVIDIA driver for CUDA 13 (vLLM 0.26.0's torch is cu130) and
# the package index; several GB. The image runs Python 3.13; any Python vLLM 0.26 supports works.
set -euo pipefail
venv=${1:-.venv-gpu}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
mapfile -t stack < <(PYTHONPATH="$here/../constructs" "$python" -c \
  'from eks_pd_serving.versions import IMAGE_PYTHON_STACK; print("\n".join(IMAGE_PYTHON_STACK))')
test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "${stack[@]}" httpx psutil PyYAML matplotlib
# The package's CDK-free modules from the source tree (a .pth file; no aws-cdk-lib here).
"$venv/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/eks_pd_serving_source.pth', 'w').write(sys.argv[1] + '\\n')" "$(cd "$here/.." && pwd)/constructs"
"$venv/bin/python" -c "import vllm, ray, nixl._api, eks_pd_serving.assembly; print('GPU rehearsal env: vllm', vllm.__version__, 'ray', ray.__version__)"
