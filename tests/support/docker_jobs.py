"""What the tests of docker_jobs in several tiers share (tests/*/test_docker_jobs.py)."""

SPEC = "jobs/multi_node.yaml"


TWO_BY_TWO = ["cluster=docker", "nodes=2", "tasks_per_node=2", "gpus_per_node=0"]
