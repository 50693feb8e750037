"""What the driver (``cluster/``) may import of ``train/``, torch-free: the rank protocol (files,
records, signals), the errors, the metrics a printed line holds, the config's schema, the
parallel dimensions and the table of strategies. A rank and the driver read them alike."""
