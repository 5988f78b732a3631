"""``meshwise plan``: enumerate, estimate, fit and rank layouts (``search``), explain the pick along
the decision order and warn (``planner``), the expert-parallel step (``experts``), the terminal
tables (``show``) and the command's defaults and glue (``command``). Never imports torch."""
