"""Scripts the interoperability tests run with the real eventmq 0.3.13 (in .venv-interop),
and the job functions both its job manager and our worker import. Nothing here imports
the project or pytest: the interop interpreter has neither."""
