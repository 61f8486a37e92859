"""The embedded demo: a sandbox with a Git remote, a host root, a tiny local model and
real vLLM, on which servegate promotes two good commits and rolls back a bad one."""
