"""Watching the serving ranks (fatal lines, exits, stalls): launch waits under it, as smoke, bench and accuracy run."""
