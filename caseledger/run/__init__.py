"""A run in motion: create and start it (start), the detached controller that holds the lease and runs the
phases in order (controller), the phase bodies (prepare: warmup, route_verify, cache_prepare; after_load:
postprocess, decide), the fresh-process preflight (preflight), a campaign's driver (campaign_driver), and four
rooms: the formal load and its confirm_end (load: one client, P processes, their shared ends, the watch, the
failure classes), what a start must pass (admission: the host's policy, the environment checks, the one admit
check), accelerator sampling (accel), and the load on other hosts over SSH (remote: load, link, preflight,
follow, hosts).

Nothing is re-exported here: `python -m caseledger.run.controller` and the preflight process import only
what they use."""
