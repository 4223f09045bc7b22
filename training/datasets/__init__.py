"""A user's images and texts: record kinds, readers (JSONL, WebDataset shards), validation, splits."""
