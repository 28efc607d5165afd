"""Runs whose load is on other hosts: the SSH link, the remote load client and its preflight, several load
hosts, and following their records back."""
