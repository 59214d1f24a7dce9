"""From plan to launch: framework configurations for a plan (layer between search and studies)."""
