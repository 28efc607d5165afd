"""What a start must pass before anything runs: the workspace's policy (allow lists) and the environment
checks of the case's programs and variables."""
