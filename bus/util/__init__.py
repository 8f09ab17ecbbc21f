"""One-job helpers that any layer may use and that know nothing of the protocols: periodic
work and waiting on the reactor, worker threads and hand-offs to the reactor's thread,
counted drop logs, whole-file replacement, SQLite in WAL mode, returning memory to the
system, the optional extras, and what the command-line tools share."""
