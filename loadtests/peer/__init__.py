"""Side-by-side benchmark against a real peer server (Infinity), each in its own environment."""
