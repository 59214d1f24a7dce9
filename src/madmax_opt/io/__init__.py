"""Problem files and catalogs: YAML loading, validation, catalog resolution, what-if hardware."""
