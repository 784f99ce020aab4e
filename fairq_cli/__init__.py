"""`fairq`: a Slurm-like command line for the fairq REST API (docs/cli.md)."""
