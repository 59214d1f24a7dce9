"""The command line: one typer app."""
