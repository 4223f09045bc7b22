"""Collections: a user's own images, embedded by a served model version and searched later."""
