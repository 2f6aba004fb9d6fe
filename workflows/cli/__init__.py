"""The ``dsx`` command line.

Each module in this package (other than ``main`` and ``output``) defines ``register(app)`` adding its
commands, and ``main.COMMANDS`` names each top-level command's module. ``main`` imports a command's
module only when that command runs, so modules import what they use at their top; ``dsx --help`` reads
its list from the registry and stays fast. Only the plot's matplotlib waits inside its function.
"""
