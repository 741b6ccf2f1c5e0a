"""The command line: the Typer app, one module per command group (`cli/commands/`), and the console views.
Belongs here: parsing, calling the library, rendering. Does not: logic a library caller would need."""
