"""What a job's ranks wrote, read back: ``scan`` (one log's bytes), ``triage`` (every rank's
state, the first failure and its cascade, hangs, stragglers; pure on records and scans),
``text`` (the report), ``plot`` (step time per rank), ``follow`` (a live stream)."""
