"""Memory about each user: recorded, superseded when a fact changes, read as of any moment."""
