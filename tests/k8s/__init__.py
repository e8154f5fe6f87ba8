"""Kubernetes test support: the API emulator, the `cluster` fixture, stand-in pods."""
