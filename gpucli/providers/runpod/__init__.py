"""RunPod: its REST and GraphQL clients, pods, Instant Clusters and network volumes, its target."""
