"""Who can call the endpoint: the serving namespace's NetworkPolicies in every exposure
(``serving_network``), and with ``endpoint_exposure=internal`` the AWS Load Balancer Controller
(``load_balancer_controller``) and the internal NLB's Service (``internal_endpoint``)."""
