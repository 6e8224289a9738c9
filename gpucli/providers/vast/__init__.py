"""vast.ai: its API client, offers and contracts, bandwidth billing, overlay clusters, its target."""
