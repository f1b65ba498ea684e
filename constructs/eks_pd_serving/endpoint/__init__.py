"""Who can call the endpoint: the serving namespace's NetworkPolicies in every exposure
(``serving_network``), and with ``endpoint_exposure=internal`` the AWS Load Balancer Controller
(``load_balancer_controller``) and the internal NLB's Service (``internal_endpoint``); with
``api_keys``, the key secret (``api_keys``) and the Serve proxies' check (``proxy``, pod-side)."""
