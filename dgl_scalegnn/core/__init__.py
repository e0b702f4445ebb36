"""Values every package shares: grid axes and layouts, the grid shape, the model's
schedule and seeds. Imports nothing else of the package but the config."""
