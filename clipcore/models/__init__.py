"""Models built from a version's manifest: open_clip towers, preprocessing, tokenizer, heads, bundle."""
