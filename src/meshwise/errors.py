"""The one exception for bad input: the CLI prints its message as one line and exits with status 2."""


class MeshwiseError(ValueError):
    """Bad input, named by field: ``"--gpus: 12 is not divisible by tp*pp = 8"``."""
