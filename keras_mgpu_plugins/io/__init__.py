"""Writing files safely, on every backend: no TensorFlow or JAX import here.

- `atomic`: the one atomic writer (a file appears at its final name complete,
  or not at all), for local paths and remote ones (`gs://...`, through
  `_backend.active().remote_files()`), and the one cleanup rule for the
  temporaries a killed writer leaves;
- `snapshots`: a checkpoint's content in host memory (`take_snapshot`), taken
  by every worker, written later from the snapshot alone; template copies;
- `backup_state`: which `BackupAndRestore` backup is whole, and which to restore;
- `async_writer`: who writes a snapshot (the chief), when (now, or on one
  background thread), and how its failure reaches every worker.
"""
