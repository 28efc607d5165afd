"""A run in motion: create and start it (start), the detached controller that holds the lease and runs the
phases in order (controller), the phase bodies (prepare: warmup, route_verify, cache_prepare; phases: the load,
with load_watch (the host's CPU, the service host's accelerators through accel), load_failures and load_parts;
after_load: confirm_end, postprocess, decide), the fresh-process preflight (preflight), and the load client on
another host over SSH (remote_load, with remote_link, remote_preflight, remote_follow and remote_hosts).

Nothing is re-exported here: `python -m caseledger.run.controller` and the preflight process import only
what they use."""
