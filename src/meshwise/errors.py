"""The exceptions the CLI turns into one line on stderr and an exit status, without a traceback."""


class MeshwiseError(ValueError):
    """Bad input, named by field: ``"--gpus: 12 is not divisible by tp*pp = 8"``. Exit status 2."""


class RunStopped(RuntimeError):
    """A run that started and then stopped early: preempted by a signal (status 128 + signal number,
    the shell's convention), a rank that stopped answering, a full disk, a worker that died (status 1).
    The message is one line; the CLI prints it and exits with ``status``."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
