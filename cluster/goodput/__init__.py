"""Goodput: ``ledger`` (where a job's time went, from its files), ``simulate`` (the ratio
predicted at scale, failures replayed against phase costs), ``advice`` (``cluster goodput`` and
``cluster logs --goodput``'s advice)."""
