"""The sizing core: pure functions over frozen dataclasses (no web, database, settings, logging or clock)."""

# Echoed by every sizing response so a stored quote names the formulas that produced it.
CALCULATION_VERSION = "2026.12.01.2"  # a tensor-parallel ring across nodes: the nodes' NICs together, NCCL's inter-node steps
# Version of the engine rules (each engine's memory defaults, scheduler defaults, layout checks and
# launch flags in app/sizing/engines/); bumped with them, and stored in every quote's snapshot.
ENGINE_RULES_VERSION = "2026.12.01.2"  # + which engines overlap host work with the GPU (vLLM from 0.8)
