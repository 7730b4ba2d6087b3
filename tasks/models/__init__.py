"""Models stage: hub listings with checksums, download, verification and manifests."""
