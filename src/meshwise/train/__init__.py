"""``meshwise train``: config, data, the training loop, checkpoints, metrics and the launcher.

- ``command``: the ``train``, ``export`` and ``generate`` commands; ``__main__``: a worker's entry;
  ``config``: TOML and command-line overrides into frozen dataclasses;
- ``loop``: one worker's run; ``layout_choice``: the layout given, or the planner's (``auto``);
  ``metrics``: per-step metrics;
- ``data``: tokens, sequences and the sample order; ``embedded_corpus``: the default corpus;
  ``tokenizer``: Hugging Face tokenizers and pre-tokenizing;
- ``checkpoint``: sharded save and resharding load (DCP); ``checkpoint_files``: the folders on disk;
  ``faults``: deliberate faults for the fault-tolerance tests;
- ``pretrained``: Hugging Face weights in; ``export``: safetensors out; ``hf_weights``: the weight
  names and config.json per family; ``generate``: sampling.

Importing this package imports no torch; :mod:`meshwise.train.loop` and the modules it uses do.
"""
