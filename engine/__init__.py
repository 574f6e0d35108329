"""The engine: egglog emission, saturation under budgets, extraction by a cost model, constant
folding and provenance (see docs/architecture.md)."""
