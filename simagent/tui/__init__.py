"""The terminal front end: a Textual app over the session's turn runner (see ARCHITECTURE.md)."""
