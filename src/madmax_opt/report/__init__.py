"""Tables, plots, timelines and Markdown reports (rich and matplotlib live here and in cli/)."""
