"""One module per command group. Each parses arguments, calls the library and renders; no logic
worth testing on its own lives here."""
