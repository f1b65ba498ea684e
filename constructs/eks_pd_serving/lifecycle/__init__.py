"""The deployment's lifecycle, computed from a synthesized template: dependency graph, create and
delete waves (``graph``), what the template's pieces are to the running system (``facts``,
``needs``), rules that must hold over every variant (``rules``), what a change does to a running
deployment (``changes``, ``effects``) and what it restarts in the Ray cluster and its Serve
applications (``rollout``). Plain JSON and cfn-lint's schemas; no aws-cdk-lib."""
