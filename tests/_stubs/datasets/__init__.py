"""Stand-in for Hugging Face ``datasets`` (see tests/_stubs/README.md): ``load_dataset(path)`` reads
``path``/rows.txt, one text per line, as a list of ``{"text": line}``."""

import os


class Dataset(list):
    def skip(self, n):
        return Dataset(self[n:])

    def shuffle(self, seed=None):
        return self


def load_dataset(path, *args, **kwargs):
    with open(os.path.join(path, "rows.txt"), encoding="utf-8") as f:
        return Dataset({"text": line.rstrip("\n")} for line in f if line.strip())
