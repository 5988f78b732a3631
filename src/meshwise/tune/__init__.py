"""``meshwise tune``: the planner narrows the field, a few measured steps decide, the profile is refitted on the way."""
