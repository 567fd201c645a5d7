"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
CALCULATION_VERSION = "2026.12.03.1"  # + the analytic ceiling at the largest batch within TPOT (bisection), load caps >= 1%
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
ENGINE_RULES_VERSION = "2026.12.02.3"  # + SGLang mem_fraction_static by release (0.4.0, 0.4.6, 0.4.9 rules)
