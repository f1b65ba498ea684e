"""Faults under load, on this machine: the deployed PD app (the rehearsal's profile) serving a constant
stream of greedy streamed chat requests on 127.0.0.1 while one fault at a time is injected, each a
unit of the ``registry`` (``fault``'s ``Fault``: what it injects, how it heals, what it must show):
``hostile`` (requests a client may not send, through the endpoint and straight to each engine),
``replica`` (the decode or the prefill replica killed), ``new_disk`` (a new node's disk: the compile
caches removed, the prefill replica killed, its successor extracting the shared ones), ``poison``
(a request whose dispatch kills
decode's engine), ``kv`` (the KV link cut and healed), ``replace`` (the runbook's decode
replacement), ``update`` (a user's next deploy, rolled as the serve rollout Job rolls it) and
``gcs`` (the Ray head's GCS killed, restarted from its store). docs/development/rehearsals.md has
the fault table, generated from the registry.

For each: how many requests failed and how (HTTP status, error text), how long until a request
started after the fault succeeded again, and whether any completed answer is wrong (``judge``):
neither the colocated control's nor the PD app's own before any fault, nor a text the control gave
under the clients' load, nor one that leaves a right text at a near tie. Bounded: each fault waits
at most ``--recovery-bound-s``; everything started is stopped at the end, and each fault cleans up
after itself in the parent.

The Ray side runs in a child process (``child``, its own session) that writes each request's
outcome (``load``) and each fault to an events file as they happen; the parent (``cli``, run by
``__main__``) judges from that file once the child has ended, however it ended.
"""
