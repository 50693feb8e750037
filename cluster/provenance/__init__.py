"""What produced a job's result: the code snapshot it runs (``snapshot``), the record of its
code, spec, versions and nodes (``record``), and two jobs compared (``compare``)."""
