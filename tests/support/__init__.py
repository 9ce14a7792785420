"""Helpers shared by the tests and the benches: test modules import from here, never from one another, and
bench/ imports from here (run as `python -m bench.X` from the root), never from a test module.

procs: running our commands and scripts as a user would; data: real photographs and their packed sets;
mllog: reading MLPerf log lines; settings: the tiny launcher settings; prep_rec: running and reading prep_rec;
ngc_ops: a CPU stand-in for NVIDIA's NormConv operators; devices: cpu(1) standing in for a rank's GPU; slurm,
imagenet_archives: a real Slurm and ImageNet-shaped archives made here."""
