"""Local CPU rehearsal of the deployed serve application (docs/development/rehearsals.md, `make rehearse`).

Its virtualenv (.venv-rehearse) holds Ray, vLLM and NIXL but not the CDK package; the one
module it shares with it, ``eks_pd_serving.assembly``, is plain JSON handling, so the package
folder is put on the path instead of installing aws-cdk-lib there.
"""

import sys
from pathlib import Path

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1] / "constructs")
if _PACKAGE_ROOT not in sys.path:
    sys.path.append(_PACKAGE_ROOT)
