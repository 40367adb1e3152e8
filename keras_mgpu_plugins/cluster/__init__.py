"""Who am I in the job, read from the environment (TF_CONFIG, SLURM, the launcher's
variables, KERAS_DISTRIBUTION_*): no backend is imported here."""
