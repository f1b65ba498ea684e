"""`python -m eks_pd_serving <command>`: preflight, sizing, cost, verify, k8s-diff."""

from .cli import main

raise SystemExit(main())
