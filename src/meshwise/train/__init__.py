"""``meshwise train``: config, data, the training loop, checkpoints, metrics and the launcher.

Importing this package imports no torch; :mod:`meshwise.train.loop` and the modules it uses do.
"""
