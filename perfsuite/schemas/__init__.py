"""File formats: results.py, the results.json format (its JSON Schema,
results.schema.json, shipped beside it as package data, and the checks
against it). Imports nothing of perfsuite: what runs in a rank checks its
record here before writing it, and every floor above reads results.json
through it."""
