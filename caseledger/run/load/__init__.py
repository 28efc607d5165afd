"""The formal load phase, one way of running it per module and one pair of ends for all of them: one client here
or on load.host (one), P client processes here or on load hosts (parts); the checks right before the first
formal request, the end evidence, the failure an end that never came maps to and the confirm_end evidence
(ends); the watch while it runs (watch) and the failure classes of its requests (failures)."""
