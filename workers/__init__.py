"""specscribe workers: everything that runs inside a worker process (ingest, ASR engine, stitching)."""
