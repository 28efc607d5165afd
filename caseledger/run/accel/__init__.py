"""Accelerator sampling during a run's load: the local sampler and the one on a remote service host."""
