"""The `runtime` package of the core (WORKSPACE.md "Layout" places it in the data flow).

Its modules: what every layer uses and nothing of gr_jax beneath: errors (UserError), validation (declared ranges),
io_utils (atomic writes with keep-previous, strict JSON, readers that name the file, fault points), provenance (a
saved file reused only if built from the same inputs and its rows match their digest; file_digest), locks (one
writer per directory), progress (bars or log lines), host_memory (glibc settings for jitted CPU loops),
compile_clock (compilation seconds apart from running, from jax.monitoring), cli (logging set-up, argparse types),
gin_checks (the gin checks library code calls; one name per setting), gin_utils (t5x-style flags, gin search order,
registration by walking the package, run_entry), command (a command's scaffold: `Command.main`), distributed (runs
over several processes: jax.distributed, process 0 writes, global batches from process-local rows)
"""
