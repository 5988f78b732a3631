"""``meshwise plan``: enumerate, estimate, fit and rank layouts, and explain the pick. Never imports
torch (``plan --verify K`` reaches the tracer through ``command``, on request).

- ``candidates``: the layouts a search weighs (one :class:`~meshwise.layout.Degrees` per
  structure) and how it ranks them; ``search``: estimate each, drop what does not fit, rank;
  ``megatron_search``: the same under ``--runtime megatron``; ``bounds``: the lower bounds both
  prune by, cached by what each reads;
- ``planner``: the search, then the explanation along the decision order and the warnings;
  ``experts``: the expert-parallel step of both; ``batch_hint``: the nearby global batch that
  allows a faster layout;
- ``compare``: several given layouts side by side; ``budget``: time and cost on a token budget;
  ``emit``: a layout as torchtitan's, Megatron-LM's or DeepSpeed's configuration;
- ``show``: the terminal tables; ``command``: the command's defaults and glue.
"""
