"""The CPU rehearsal of the deployed serve application (`make rehearse`) and the GPU one
(`make rehearse-gpu`); docs/development/rehearsals.md.

Their virtualenvs (.venv-rehearse, .venv-gpu) hold Ray, vLLM and NIXL but not aws-cdk-lib; the
modules they share with the package (``eks_pd_serving.assembly``, the observability catalogue)
are plain Python, found through a .pth file the install scripts write (elsewhere:
``PYTHONPATH=constructs``).
"""
