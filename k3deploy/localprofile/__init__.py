"""The local profile's offline pieces."""
