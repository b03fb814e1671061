"""What fastload does at a fork, at exit and on a signal (NOTE in ``hooks.py``):
one ordered registry of hooks, signals held where CPython would drop them,
forks of the loader's own workers told apart, pipe ends and weak registries
a forked child lets go of."""
