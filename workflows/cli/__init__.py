"""The ``dsx`` command line.

Each module in this package (other than ``main`` and ``output``) defines ``register(app)`` adding its
commands; ``main`` finds them all. Modules import only light things at the top (typer, the standard
library); heavy libraries are imported inside the command functions so ``dsx --help`` stays fast.
"""
