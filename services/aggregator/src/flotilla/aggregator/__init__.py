"""Flotilla aggregator."""
