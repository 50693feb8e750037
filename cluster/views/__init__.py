"""What a person looks at: the job's and the sweep's pages (``cluster page``), the pictures in
them and behind ``cluster logs --plot`` (``charts``: matplotlib), and TensorBoard's events
(``tensorboard``), all from the same reading of the job as ``cluster logs``."""
