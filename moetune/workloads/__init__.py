"""Programs that run inside the job, in the job's own interpreter, by their path: they read the
environment and their arguments and import nothing of moetune's login side."""
