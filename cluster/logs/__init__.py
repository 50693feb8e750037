"""What a job's ranks wrote, read back: ``scan`` (one log's bytes) and ``reader`` (a rank's
files to evidence), ``rules`` (evidence to states, the first failure and its cascade, hangs,
stragglers: pure), ``triage`` (``inspect``: the two over every rank, on every core through
``parallel``, the backend asked whether the job runs), ``report`` (what it says), ``kills``
(what the scheduler says ended a rank), ``text``, ``plot``, ``follow`` (a live stream)."""
