"""Kubernetes integration: client layer, control loops, CRDs and the operator CLI."""
