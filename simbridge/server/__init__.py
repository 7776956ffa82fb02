"""The bridge: gRPC service, sessions, episodes, policies and the experience they make."""
