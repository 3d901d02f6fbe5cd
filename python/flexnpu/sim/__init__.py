"""Cluster simulator (see python -m flexnpu simulate --help)."""
