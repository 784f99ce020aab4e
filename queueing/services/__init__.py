"""Services: every state change of fairq, each owning its transaction and its events."""
