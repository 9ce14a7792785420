"""Stand-ins, on a CPU, for what only a GPU run has (NVIDIA's fused MXNet operators)."""
