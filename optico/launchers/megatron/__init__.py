"""The megatron-core benchmark driver (`bench`, run under torchrun) and its parts:
`model` builds config, layer spec, model, DDP and optimizer from a Workload and a Strategy;
`layers` holds the no-Transformer-Engine attention and norm; `compat` the version and TE
guards; `cpu_shim` every workaround for running without CUDA; `report` the output lines,
error categories and statistics. Importing this package imports neither torch nor megatron."""
