"""Texts generated for a user's data: difference texts, hard negatives, comparatives (template or LLM)."""
